package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is the directory holding the control plane's certificates and keys.
type pki string

func (p pki) path(name string) string { return filepath.Join(string(p), name) }

// identity is one client or server certificate to issue from the CA.
type identity struct {
	file   string
	cn     string
	orgs   []string
	server bool
}

// identities: the API server's serving certificate, the admin (system:masters bypasses RBAC, as in
// kubeadm's admin.conf) and kube-controller-manager (bound by the bootstrap RBAC policy).
var identities = []identity{
	{file: "apiserver", cn: "kube-apiserver", server: true},
	{file: "admin", cn: "devcluster-admin", orgs: []string{"system:masters"}},
	{file: "kcm", cn: "system:kube-controller-manager"},
}

// writePKI creates a fresh CA, the certificates above, and an RSA key pair for signing
// ServiceAccount tokens (TokenRequest). Everything is new on every start: nothing is reused.
func writePKI(dir string) (pki, error) {
	p := pki(dir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return p, err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return p, err
	}
	now := time.Now()
	caTemplate := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "devcluster-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		return p, err
	}
	caCert, _ := x509.ParseCertificate(caDER)
	if err := writePEM(p.path("ca.crt"), "CERTIFICATE", caDER); err != nil {
		return p, err
	}
	for i, id := range identities {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return p, err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(int64(i + 2)),
			Subject:      pkix.Name{CommonName: id.cn, Organization: id.orgs},
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(365 * 24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}
		if id.server {
			tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
			tmpl.DNSNames = []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"}
			tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.96.0.1")}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			return p, err
		}
		if err := writePEM(p.path(id.file+".crt"), "CERTIFICATE", der); err != nil {
			return p, err
		}
		if err := writeKey(p.path(id.file+".key"), key); err != nil {
			return p, err
		}
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return p, err
	}
	if err := writeKey(p.path("sa.key"), saKey); err != nil {
		return p, err
	}
	pub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return p, err
	}
	return p, writePEM(p.path("sa.pub"), "PUBLIC KEY", pub)
}

func writeKey(path string, key crypto.Signer) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(path, "PRIVATE KEY", der)
}

func writePEM(path, kind string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600)
}

func loadPool(caFile string) (*x509.CertPool, error) {
	data, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("no certificate in %s", caFile)
	}
	return pool, nil
}

// kubeconfig is a client-certificate kubeconfig for one identity, with the data embedded so the
// file can be copied elsewhere and still work.
type kubeconfig struct{ server, ca, cert, key string }

func (k kubeconfig) write(path string) error {
	var data [3][]byte
	for i, f := range []string{k.ca, k.cert, k.key} {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		data[i] = b
	}
	b64 := base64.StdEncoding.EncodeToString
	text := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: devcluster
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: devcluster-user
  user:
    client-certificate-data: %s
    client-key-data: %s
contexts:
- name: devcluster
  context: {cluster: devcluster, user: devcluster-user}
current-context: devcluster
`, k.server, b64(data[0]), b64(data[1]), b64(data[2]))
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(text), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path) // atomic: a reader never sees half a file
}
