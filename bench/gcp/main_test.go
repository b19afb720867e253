package main

import (
	"bytes"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/protodelim"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

func res(t *testing.T, name, version string, msg proto.Message) *discovery.Resource {
	t.Helper()
	a, err := anypb.New(msg)
	if err != nil {
		t.Fatal(err)
	}
	return &discovery.Resource{Name: name, Version: version, Resource: a}
}

func encoded(t *testing.T, rs ...*discovery.Resource) *bytes.Buffer {
	t.Helper()
	var b bytes.Buffer
	for _, r := range rs {
		if _, err := protodelim.MarshalTo(&b, r); err != nil {
			t.Fatal(err)
		}
	}
	return &b
}

func TestADumpIsReadByTypeAndName(t *testing.T) {
	d, err := readDump(encoded(t,
		res(t, "a.vip", "1", &cluster.Cluster{Name: "a.vip"}),
		res(t, "a.vip", "2", &endpoint.ClusterLoadAssignment{ClusterName: "a.vip"})))
	if err != nil {
		t.Fatal(err)
	}
	if countOf(d) != 2 || d[resource.ClusterType]["a.vip"].GetVersion() != "1" || d[resource.EndpointType]["a.vip"].GetVersion() != "2" {
		t.Fatalf("read %v", d)
	}
}

func TestAResourceOfAnotherTypeIsRefused(t *testing.T) {
	if _, err := readDump(encoded(t, res(t, "x", "1", &discovery.Resource{}))); err == nil {
		t.Fatal("no error")
	}
}

func TestOnlyResourcesWhoseVersionChangedAreUpdated(t *testing.T) {
	prev, _ := readDump(encoded(t,
		res(t, "a.vip", "1", &cluster.Cluster{Name: "a.vip"}),
		res(t, "b.vip", "1", &cluster.Cluster{Name: "b.vip"}),
		res(t, "c.vip", "1", &cluster.Cluster{Name: "c.vip"})))
	// a.vip: other bytes, same version (a map written in another order): not a change.
	next, _ := readDump(encoded(t,
		res(t, "a.vip", "1", &cluster.Cluster{Name: "a.vip", AltStatName: "other bytes"}),
		res(t, "b.vip", "2", &cluster.Cluster{Name: "b.vip"}),
		res(t, "d.vip", "1", &cluster.Cluster{Name: "d.vip"})))
	changes, err := diff(prev, next)
	if err != nil {
		t.Fatal(err)
	}
	c := changes[resource.ClusterType]
	if len(changes) != 1 || len(c.update) != 2 || c.update["b.vip"] == nil || c.update["d.vip"] == nil {
		t.Fatalf("updates %v", changes)
	}
	if len(c.remove) != 1 || c.remove[0] != "c.vip" {
		t.Fatalf("removals %v", c.remove)
	}
}
