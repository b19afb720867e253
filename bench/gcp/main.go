// Command gcp is go-control-plane serving exactly the resources odmesh-control serves, for the
// scale benchmark's comparison (docs/benchmarks.md, section 4; bench/run.py's "gcp" section).
//
// A delta ADS server with a cache.LinearCache per type (Cluster, ClusterLoadAssignment) behind
// a cache.MuxCache, as go-control-plane recommends for resources a fleet shares. The resources
// come from a dump written by `odmesh-bench xds-dump` (length-delimited
// envoy.service.discovery.v3.Resource messages). The dump is polled; on a change only the
// resources whose version changed (odmesh's version: a hash of the resource) go to the caches (UpdateResources), so only their subscribers
// are woken.
//
// Log lines start with an RFC 3339 UTC time in microseconds, as odmesh-control's do, so that
// `odmesh-bench xds-load --dump` reads both alike: "dump read" (read and decoded), "dump diffed"
// (the changed resources found), "resources updated" (UpdateResources returned).
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	_ "net/http/pprof"
	"os"
	"sort"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/encoding/protodelim"
)

// The gRPC settings of go-control-plane's example server (internal/example/server.go).
const (
	grpcKeepaliveTime        = 30 * time.Second
	grpcKeepaliveTimeout     = 5 * time.Second
	grpcKeepaliveMinTime     = 30 * time.Second
	grpcMaxConcurrentStreams = 1000000
)

// servedTypes are the type URLs a dump holds, one LinearCache each.
var servedTypes = []string{resource.ClusterType, resource.EndpointType}

// dump is a dump's resources: type URL → name → resource.
type dump map[string]map[string]*discovery.Resource

func logf(format string, args ...any) {
	now := time.Now().UTC().Format("2006-01-02T15:04:05.000000Z")
	fmt.Fprintf(os.Stderr, "%s %s\n", now, fmt.Sprintf(format, args...))
}

// readDump decodes a dump from r.
func readDump(r io.Reader) (dump, error) {
	out := dump{}
	for _, t := range servedTypes {
		out[t] = map[string]*discovery.Resource{}
	}
	br := bufio.NewReader(r)
	for {
		res := &discovery.Resource{}
		err := protodelim.UnmarshalFrom(br, res)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("resource %d: %w", countOf(out), err)
		}
		typeURL := res.GetResource().GetTypeUrl()
		byName, ok := out[typeURL]
		if !ok {
			return nil, fmt.Errorf("resource %q: type %q is not served", res.GetName(), typeURL)
		}
		byName[res.GetName()] = res
	}
}

func countOf(d dump) int {
	n := 0
	for _, byName := range d {
		n += len(byName)
	}
	return n
}

// change is what one type's cache is given: the resources to set, the names to remove.
type change struct {
	update map[string]types.Resource
	remove []string
}

// same answers whether two resources of one name are the same: by odmesh's version, a hash of
// a canonical encoding (prost writes a map field in a random order, so equal resources may
// differ in bytes), or by bytes when either has no version.
func same(a, b *discovery.Resource) bool {
	if a.GetVersion() != "" && b.GetVersion() != "" {
		return a.GetVersion() == b.GetVersion()
	}
	return bytes.Equal(a.GetResource().GetValue(), b.GetResource().GetValue())
}

// diff is, per type, the resources of next that are not the same as (or are not in) prev's,
// decoded, and the names prev has and next does not. Types without a change are left out.
func diff(prev, next dump) (map[string]change, error) {
	out := map[string]change{}
	for _, typeURL := range servedTypes {
		c := change{update: map[string]types.Resource{}}
		for name, res := range next[typeURL] {
			if old, ok := prev[typeURL][name]; ok && same(old, res) {
				continue
			}
			msg, err := res.GetResource().UnmarshalNew()
			if err != nil {
				return nil, fmt.Errorf("%s %q: %w", typeURL, name, err)
			}
			c.update[name] = msg
		}
		for name := range prev[typeURL] {
			if _, ok := next[typeURL][name]; !ok {
				c.remove = append(c.remove, name)
			}
		}
		sort.Strings(c.remove)
		if len(c.update) > 0 || len(c.remove) > 0 {
			out[typeURL] = c
		}
	}
	return out, nil
}

// source is the dump file as last read.
type source struct {
	path    string
	modTime time.Time
	size    int64
	current dump
	caches  map[string]*cache.LinearCache
}

// reload reads the dump if its modification time or size changed, and hands the caches what
// changed. It answers whether it read the file.
func (s *source) reload() (bool, error) {
	st, err := os.Stat(s.path)
	if err != nil {
		return false, err
	}
	if st.ModTime().Equal(s.modTime) && st.Size() == s.size {
		return false, nil
	}
	f, err := os.Open(s.path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	next, err := readDump(f)
	if err != nil {
		return false, fmt.Errorf("%s: %w", s.path, err)
	}
	s.modTime, s.size = st.ModTime(), st.Size()
	logf("dump read resources=%d", countOf(next))
	changes, err := diff(s.current, next)
	if err != nil {
		return false, err
	}
	changed := 0
	for _, c := range changes {
		changed += len(c.update) + len(c.remove)
	}
	logf("dump diffed changed=%d", changed)
	for typeURL, c := range changes {
		if err := s.caches[typeURL].UpdateResources(c.update, c.remove); err != nil {
			return true, fmt.Errorf("%s: %w", typeURL, err)
		}
	}
	logf("resources updated")
	s.current = next
	return true, nil
}

func main() {
	dumpPath := flag.String("dump", "", "the dump to serve (odmesh-bench xds-dump)")
	listen := flag.String("listen", "127.0.0.1:18200", "where to listen for gRPC")
	poll := flag.Duration("poll", 200*time.Millisecond, "how often to look at the dump's modification time")
	pprof := flag.String("pprof", "", "where to serve net/http/pprof (e.g. 127.0.0.1:6060), to see where the memory goes; off when empty")
	flag.Parse()
	if *dumpPath == "" {
		fmt.Fprintln(os.Stderr, "usage: gcp -dump FILE [-listen ADDR] [-poll DURATION]")
		os.Exit(2)
	}

	caches := map[string]*cache.LinearCache{}
	muxed := map[string]cache.Cache{}
	for _, t := range servedTypes {
		caches[t] = cache.NewLinearCache(t)
		muxed[t] = caches[t]
	}
	mux := &cache.MuxCache{
		Classify:      func(r *cache.Request) string { return r.GetTypeUrl() },
		ClassifyDelta: func(r *cache.DeltaRequest) string { return r.GetTypeUrl() },
		Caches:        muxed,
	}
	src := &source{path: *dumpPath, current: dump{}, caches: caches}
	if _, err := src.reload(); err != nil {
		logf("error: %v", err)
		os.Exit(1)
	}

	grpcServer := grpc.NewServer(
		grpc.MaxConcurrentStreams(grpcMaxConcurrentStreams),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: grpcKeepaliveTime, Timeout: grpcKeepaliveTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: grpcKeepaliveMinTime, PermitWithoutStream: true}),
	)
	discovery.RegisterAggregatedDiscoveryServiceServer(grpcServer, server.NewServer(context.Background(), mux, nil))
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		logf("error: %v", err)
		os.Exit(1)
	}

	if *pprof != "" {
		go func() { logf("pprof: %v", http.ListenAndServe(*pprof, nil)) }()
	}
	go func() {
		for range time.Tick(*poll) {
			if _, err := src.reload(); err != nil {
				logf("error: %v", err)
			}
		}
	}()
	logf("serving %d clusters on %s", len(src.current[resource.ClusterType]), lis.Addr())
	if err := grpcServer.Serve(lis); err != nil {
		logf("error: %v", err)
		os.Exit(1)
	}
}
