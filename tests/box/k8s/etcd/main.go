// Command etcd is the box's etcd: go.etcd.io/etcd/server/v3's embedded server on
// loopback, one member, data under -data-dir. It prints "ready" once it serves.
package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	dataDir := flag.String("data-dir", "", "data directory")
	client := flag.String("listen-client", "http://127.0.0.1:2379", "client URL (loopback)")
	peer := flag.String("listen-peer", "http://127.0.0.1:2380", "peer URL (loopback)")
	flag.Parse()
	if *dataDir == "" {
		fmt.Fprintln(os.Stderr, "etcd: -data-dir is required")
		os.Exit(2)
	}
	cfg := embed.NewConfig()
	cfg.Dir = *dataDir
	cu, err := url.Parse(*client)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd:", err)
		os.Exit(2)
	}
	pu, err := url.Parse(*peer)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd:", err)
		os.Exit(2)
	}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	cfg.LogLevel = "error"
	// A box's etcd lives as long as one pytest worker and is thrown away with it: nothing is meant to outlive a
	// crash, and an fsync per write made every API write wait on a disk shared with the rest of the test suite.
	cfg.UnsafeNoFsync = true
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd:", err)
		os.Exit(1)
	}
	defer e.Close()
	<-e.Server.ReadyNotify()
	fmt.Println("ready")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sig:
	case err := <-e.Err():
		fmt.Fprintln(os.Stderr, "etcd:", err)
		os.Exit(1)
	}
}
