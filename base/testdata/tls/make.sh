#!/bin/sh
# Test-only certificates for the TLS tests of base/src/tls.rs, the Eureka client's HTTPS tests
# (eureka/src/client/tests.rs) and the xDS server's TLS tests (control/tests/xds_grpc.rs).
# The private keys here guard nothing: never trust ca.pem or other-ca.pem anywhere else.
#
#   ca.pem                         the CA the tests name with --eureka-ca
#   server.pem, server.key         signed by ca.pem, for localhost and 127.0.0.1
#   other-ca.pem                   a second CA, trusted by no test
#   other-server.pem, .key         signed by other-ca.pem, for localhost and 127.0.0.1
#   wrong-name.pem, .key           signed by ca.pem, but only for eureka.example
#   client.pem, .key               signed by ca.pem, a client certificate (clientAuth), for
#                                  the xDS server's mTLS tests
#   broken-ca.pem                  ca.pem, then a PEM block that is not a certificate
#
# Valid for 100 years, so the tests do not expire. The CA keys are deleted once used, so
# adding a certificate means remaking them all:
#   sh base/testdata/tls/make.sh
# P-256 keys (PKCS#8), SHA-256 signatures; the extensions are the ones rustls (webpki)
# checks: a CA with basicConstraints CA:TRUE and keyCertSign, a server certificate with a
# subjectAltName, serverAuth and CA:FALSE.
set -eu
cd "$(dirname "$0")"
days=36500
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1"; }

ca() { # name, subject
    key "$1.key"
    openssl req -x509 -new -key "$1.key" -sha256 -days "$days" -subj "/CN=$2" \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -addext "subjectKeyIdentifier=hash" \
        -out "$1.pem"
}

leaf() { # name, signing CA, subjectAltName, extendedKeyUsage
    key "$1.key"
    openssl req -new -key "$1.key" -subj "/CN=$1" -out "$1.csr"
    printf '%s\n' \
        "basicConstraints=critical,CA:FALSE" \
        "keyUsage=critical,digitalSignature" \
        "extendedKeyUsage=$4" \
        "subjectAltName=$3" \
        "authorityKeyIdentifier=keyid" >"$1.ext"
    openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial \
        -sha256 -days "$days" -extfile "$1.ext" -out "$1.pem"
    rm -f "$1.csr" "$1.ext" "$2.srl"
}

ca ca "odmesh test CA"
ca other-ca "odmesh other test CA"
leaf server ca "DNS:localhost,IP:127.0.0.1" serverAuth
leaf other-server other-ca "DNS:localhost,IP:127.0.0.1" serverAuth
leaf wrong-name ca "DNS:eureka.example" serverAuth
leaf client ca "DNS:proxy.example" clientAuth
{
    cat ca.pem
    echo '-----BEGIN CERTIFICATE-----'
    printf 'not a certificate' | openssl base64
    echo '-----END CERTIFICATE-----'
} >broken-ca.pem
rm -f ca.key other-ca.key
