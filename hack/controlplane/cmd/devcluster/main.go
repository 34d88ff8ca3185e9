// Command devcluster runs a real, throwaway Kubernetes control plane on 127.0.0.1 for the project's
// tests, benchmarks and demo.
//
// It decides: free ports, a fresh PKI (CA, serving certificate, admin and controller-manager client
// certificates, service-account signing key), an embedded etcd, and the flags of kube-apiserver
// (TLS, RBAC, TokenRequest, dual-stack Service CIDRs with IPv4 the primary family, the NodePort
// range: Kubernetes' default unless -service-node-port-range widens it) and kube-controller-manager
// (only the controllers the tests rely on: garbage collector, namespace, endpoints, endpoint slices,
// resource quota, service accounts).
//
// It does not run a scheduler, a kubelet, kube-proxy or a load balancer: tests play those parts
// through the API. Nothing listens beyond the loopback interface, and everything lives in -dir.
//
// When the control plane is ready it writes <dir>/kubeconfig (admin) and then <dir>/ready; it stops
// its children and etcd on SIGINT/SIGTERM, when a child dies, or (with -exit-on-stdin-close) when
// whoever started it goes away.
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// controllers are the kube-controller-manager loops the tests depend on; everything else stays off
// so the control plane stays small and its behaviour easy to reason about.
var controllers = []string{
	"garbage-collector-controller",
	"namespace-controller",
	"endpoints-controller",
	"endpointslice-controller",
	"resourcequota-controller",
	"serviceaccount-controller", // creates "default" ServiceAccounts so Pods pass admission
}

// serviceCIDRs only feed the ClusterIP allocator: no traffic is ever routed to them. Dual-stack,
// IPv4 first: the first range's family is the primary one, so a Service that names no family is
// single-stack IPv4 and the "kubernetes" Service's ClusterIP is 10.96.0.1 (which the serving
// certificate names); the second, IPv6 (a ULA), is what an IPv6 or a dual-stack Service draws from.
// In this release (MultiCIDRServiceAllocator locked on) kube-apiserver turns the flag into the
// default ServiceCIDR object and marks it Ready itself, so no controller-manager loop is needed; the
// controller manager's own --service-cluster-ip-range only feeds node IPAM (--allocate-node-cidrs),
// which does not run here, so it is not passed there.
var serviceCIDRs = []string{"10.96.0.0/16", "fd00:10:96::/112"}

// defaultNodePortRange is kube-apiserver's own default --service-node-port-range; nothing listens on
// a NodePort here (no kube-proxy), so a wider range costs only the allocator's bitmap.
const defaultNodePortRange = "30000-32767"

func main() {
	dir := flag.String("dir", "", "state directory (PKI, etcd data, kubeconfig, logs)")
	binDir := flag.String("bin", "", "directory holding kube-apiserver and kube-controller-manager (default: beside this binary)")
	exitOnStdinClose := flag.Bool("exit-on-stdin-close", false, "stop when standard input reaches EOF (the parent went away)")
	readyTimeout := flag.Duration("ready-timeout", 90*time.Second, "how long to wait for the API server to become ready")
	nodePortRange := flag.String("service-node-port-range", defaultNodePortRange, "kube-apiserver's --service-node-port-range (each LoadBalancer Service with externalTrafficPolicy Local takes one)")
	flag.Parse()
	if *dir == "" {
		log.Fatal("-dir is required")
	}
	if *binDir == "" {
		self, err := os.Executable()
		if err != nil {
			log.Fatal(err)
		}
		*binDir = filepath.Dir(self)
	}
	if err := run(*dir, *binDir, *exitOnStdinClose, *readyTimeout, *nodePortRange); err != nil {
		log.Fatalf("devcluster: %v", err)
	}
}

func run(dir, binDir string, exitOnStdinClose bool, readyTimeout time.Duration, nodePortRange string) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	for _, stale := range []string{"ready", "kubeconfig"} {
		_ = os.Remove(filepath.Join(dir, stale))
	}
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o755); err != nil {
		return err
	}
	ports, err := freePorts(4)
	if err != nil {
		return err
	}
	etcdClient, etcdPeer, apiPort, kcmPort := ports[0], ports[1], ports[2], ports[3]
	server := fmt.Sprintf("https://127.0.0.1:%d", apiPort)

	p, err := writePKI(filepath.Join(dir, "pki"))
	if err != nil {
		return fmt.Errorf("pki: %w", err)
	}

	started := time.Now()
	etcd, err := startEtcd(filepath.Join(dir, "etcd"), etcdClient, etcdPeer)
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	defer etcd.Close()

	apiserver, err := spawn(binDir, "kube-apiserver", dir, []string{
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(apiPort),
		"--etcd-servers=" + fmt.Sprintf("http://127.0.0.1:%d", etcdClient),
		"--tls-cert-file=" + p.path("apiserver.crt"),
		"--tls-private-key-file=" + p.path("apiserver.key"),
		"--client-ca-file=" + p.path("ca.crt"),
		"--authorization-mode=RBAC",
		"--service-account-issuer=" + server,
		"--service-account-key-file=" + p.path("sa.pub"),
		"--service-account-signing-key-file=" + p.path("sa.key"),
		"--api-audiences=" + server,
		"--service-cluster-ip-range=" + strings.Join(serviceCIDRs, ","),
		"--service-node-port-range=" + nodePortRange,
		"--allow-privileged=true",
		// As hardened clusters (OpenShift, many managed offerings) run it: setting an owner
		// reference with blockOwnerDeletion needs update on the owner's finalizers subresource.
		"--enable-admission-plugins=OwnerReferencesPermissionEnforcement",
		// The lease reconciler refuses a loopback advertise address, and nothing here needs the
		// endpoints of the "kubernetes" Service.
		"--endpoint-reconciler-type=none",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		"--v=0",
	})
	if err != nil {
		return err
	}
	children := []*child{apiserver}
	defer func() { stopAll(children) }()

	admin := kubeconfig{server: server, ca: p.path("ca.crt"), cert: p.path("admin.crt"), key: p.path("admin.key")}
	if err := waitReady(server, admin, readyTimeout, apiserver); err != nil {
		return err
	}
	kcmConfig := filepath.Join(dir, "kube-controller-manager.kubeconfig")
	if err := (kubeconfig{server: server, ca: p.path("ca.crt"), cert: p.path("kcm.crt"), key: p.path("kcm.key")}).write(kcmConfig); err != nil {
		return err
	}
	kcm, err := spawn(binDir, "kube-controller-manager", dir, []string{
		"--kubeconfig=" + kcmConfig,
		"--authentication-kubeconfig=" + kcmConfig,
		"--authorization-kubeconfig=" + kcmConfig,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(kcmPort),
		"--leader-elect=false",
		"--controllers=" + strings.Join(controllers, ","),
		"--use-service-account-credentials=true", // each controller acts as its own ServiceAccount, as in kubeadm clusters
		"--root-ca-file=" + p.path("ca.crt"),
		"--service-account-private-key-file=" + p.path("sa.key"),
		"--concurrent-gc-syncs=10",
		"--profiling=false",
		"--v=0",
	})
	if err != nil {
		return err
	}
	children = append(children, kcm)

	// The kubeconfig appears only once the API server answers, so its existence means "usable".
	if err := admin.write(filepath.Join(dir, "kubeconfig")); err != nil {
		return err
	}
	info, _ := json.Marshal(map[string]any{
		"server":         server,
		"kubeconfig":     filepath.Join(dir, "kubeconfig"),
		"pid":            os.Getpid(),
		"readySeconds":   time.Since(started).Seconds(),
		"apiserverPID":   apiserver.cmd.Process.Pid,
		"controllersPID": kcm.cmd.Process.Pid,
	})
	if err := os.WriteFile(filepath.Join(dir, "ready"), info, 0o644); err != nil {
		return err
	}
	log.Printf("devcluster: ready at %s in %.1fs (kubeconfig %s)", server, time.Since(started).Seconds(), filepath.Join(dir, "kubeconfig"))

	return waitForStop(exitOnStdinClose, children)
}

// child is a running control-plane process; done closes when it exits (one goroutine waits on it).
type child struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// waitForStop blocks until a signal, the end of stdin (if asked), or the death of a child.
func waitForStop(exitOnStdinClose bool, children []*child) error {
	stop := make(chan error, len(children)+2)
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	go func() { s := <-signals; stop <- fmt.Errorf("stopping on %v", s) }()
	if exitOnStdinClose {
		go func() { _, _ = io.Copy(io.Discard, os.Stdin); stop <- errors.New("stopping: stdin closed") }()
	}
	died := make(chan *child, len(children))
	for _, c := range children {
		go func(c *child) { <-c.done; died <- c }(c)
	}
	select {
	case reason := <-stop:
		log.Printf("devcluster: %v", reason)
		return nil
	case c := <-died:
		return fmt.Errorf("%s exited: %v (see logs/%s.log)", c.name, c.err, c.name)
	}
}

// spawn starts one control-plane binary with its output in <dir>/logs/<name>.log. Pdeathsig makes
// the kernel kill it if devcluster itself dies, so nothing outlives the launcher.
func spawn(binDir, name, dir string, args []string) (*child, error) {
	logFile, err := os.Create(filepath.Join(dir, "logs", name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(filepath.Join(binDir, name), args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { c.err = cmd.Wait(); _ = logFile.Close(); close(c.done) }()
	return c, nil
}

func stopAll(children []*child) {
	for i := len(children) - 1; i >= 0; i-- {
		c := children[i]
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.done:
		case <-time.After(10 * time.Second):
			_ = c.cmd.Process.Kill()
			<-c.done
		}
	}
}
func startEtcd(dataDir string, clientPort, peerPort int) (*embed.Etcd, error) {
	cfg := embed.NewConfig()
	cfg.Name = "devcluster"
	cfg.Dir = dataDir
	client, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", clientPort))
	peer, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", peerPort))
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*client}, []url.URL{*client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*peer}, []url.URL{*peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.UnsafeNoFsync = true // throwaway data: durability is worth nothing here, speed is
	cfg.LogLevel = "error"
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, err
	}
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case <-time.After(30 * time.Second):
		e.Close()
		return nil, errors.New("etcd not ready within 30s")
	}
}

func waitReady(server string, admin kubeconfig, timeout time.Duration, apiserver *child) error {
	cert, err := tls.LoadX509KeyPair(admin.cert, admin.key)
	if err != nil {
		return err
	}
	pool, err := loadPool(admin.ca)
	if err != nil {
		return err
	}
	client := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool}},
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, server+"/readyz", nil)
		resp, err := client.Do(req)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-apiserver.done:
			return fmt.Errorf("kube-apiserver exited before it was ready: %v (see logs/kube-apiserver.log)", apiserver.err)
		case <-ctx.Done():
			return fmt.Errorf("kube-apiserver not ready within %s (see logs/kube-apiserver.log)", timeout)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func freePorts(n int) ([]int, error) {
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			_ = l.Close()
		}
	}()
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		listeners = append(listeners, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
