package atls_test

import (
	"bytes"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/attestation"
)

// onlyKey authorizes one ed25519 public key, as a node does its owner's.
func onlyKey(want ed25519.PublicKey) func(crypto.PublicKey) error {
	return func(k crypto.PublicKey) error {
		if got, ok := k.(ed25519.PublicKey); ok && bytes.Equal(got, want) {
			return nil
		}
		return errors.New("this node answers only its owner")
	}
}

func TestClientKeyAuthorized(t *testing.T) {
	e := newEnv(t)
	ownerPub, ownerKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, strangerKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	issuer := &countingIssuer{Issuer: e.issuer}
	var refused atomic.Int32
	addr, seen := serve(t, atls.Config{
		Issuer:          issuer,
		AuthorizeClient: onlyKey(ownerPub),
		OnPeerRejected:  func(net.Addr, error) { refused.Add(1) },
	})
	verify := []attestation.Validator{e.validator(t, e.want)}

	if err := call(t, addr, atls.Config{Validators: verify, ClientKey: ownerKey}); err != nil {
		t.Fatalf("the owner's key was refused: %v", err)
	}
	ai := <-seen
	if got, _ := ai.TLS.PeerCertificates[0].PublicKey.(ed25519.PublicKey); !bytes.Equal(got, ownerPub) {
		t.Fatalf("server saw client key %x, want the owner's %x", got, ownerPub)
	}
	if issuer.issued() != 1 {
		t.Fatalf("server quoted %d times for the owner, want 1", issuer.issued())
	}

	for name, key := range map[string]crypto.Signer{"another key": strangerKey, "a fresh key": nil} {
		err := call(t, addr, atls.Config{Validators: verify, ClientKey: key})
		if err == nil || !strings.Contains(err.Error(), "answers only its owner") {
			t.Errorf("client with %s: got %v, want a refusal that says the node answers only its owner", name, err)
		}
	}
	if n := issuer.issued(); n != 1 {
		t.Errorf("server quoted %d times in all, want 1: a refused client must cost no quote", n)
	}
	if refused.Load() < 2 {
		t.Errorf("OnPeerRejected heard of %d refused clients, want at least 2", refused.Load())
	}
}
