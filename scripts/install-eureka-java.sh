#!/usr/bin/env bash
# Builds the real Spring Cloud Netflix Eureka server and the Spring Boot Eureka client driver
# that the tests run, from the Maven projects in tests/eureka-java/, into the git-ignored
# .tools/eureka-java/:
#   .tools/eureka-java/eureka-server.jar   (tests/eureka-java/server)
#   .tools/eureka-java/eureka-client.jar   (tests/eureka-java/client)
# Their dependencies come from Maven Central into .tools/m2 (about 100 MB the first time).
# Needs a JDK 17 or later and Maven. Idempotent: skips the build while the projects' files
# are those of the last build (a sha256 stamp).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
src="$root/tests/eureka-java"
dest="$root/.tools/eureka-java"

missing=()
command -v java >/dev/null || missing+=("java")
command -v javac >/dev/null || missing+=("javac (a JDK, not only a JRE)")
command -v mvn >/dev/null || missing+=("mvn (Apache Maven)")
if ((${#missing[@]})); then
  echo "install-eureka-java: not found: ${missing[*]}; a JDK 17 or later and Maven build and run" \
    "the real Eureka server and Java client of the tests (Debian: apt-get install" \
    "openjdk-17-jdk-headless maven)" >&2
  exit 1
fi
java_version="$(java -XshowSettings:properties -version 2>&1 |
  awk -F' = ' '/java.specification.version/ {print $2}')"
if [[ ! "$java_version" =~ ^[0-9]+$ ]] || ((java_version < 17)); then
  echo "install-eureka-java: java ${java_version:-of an unknown version} is on PATH; Java 17 or later is needed" >&2
  exit 1
fi

# The stamp: every file of both projects (not their build output), by path relative to
# tests/eureka-java/, so that worktrees sharing .tools/ agree on it.
stamp="$(cd "$src" && find . -path '*/target' -prune -o -type f -print | LC_ALL=C sort |
  xargs sha256sum | sha256sum | cut -d' ' -f1)"
if [[ "$(cat "$dest/.stamp" 2>/dev/null)" == "$stamp" && -f "$dest/eureka-server.jar" &&
  -f "$dest/eureka-client.jar" ]]; then
  echo "eureka-server.jar and eureka-client.jar are up to date in $dest"
  exit 0
fi

mkdir -p "$dest"
for project in server client; do
  echo "install-eureka-java: building tests/eureka-java/$project with Maven"
  mvn -B -q -Dmaven.repo.local="$root/.tools/m2" -f "$src/$project/pom.xml" package
  # Copied under a temporary name, then renamed: a test starting now sees the old jar or the new.
  cp "$src/$project/target/eureka-$project.jar" "$dest/.eureka-$project.jar.tmp"
  mv "$dest/.eureka-$project.jar.tmp" "$dest/eureka-$project.jar"
done
echo "$stamp" > "$dest/.stamp"
echo "eureka-server.jar and eureka-client.jar built in $dest"
