package owneraccess

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestHeaderField(t *testing.T) {
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	f := HeaderField(pub)
	if len(f) > 47 {
		t.Fatalf("HeaderField has %d bytes; a LUKS2 subsystem holds 47", len(f))
	}
	if got, err := FromHeaderField(f); err != nil || !got.Equal(pub) {
		t.Fatalf("FromHeaderField(HeaderField(k)) = %x, %v", got, err)
	}
	for _, bad := range []string{"", "orrery", f[:42], f + "A", strings.Repeat("!", 43)} {
		if _, err := FromHeaderField(bad); err == nil {
			t.Errorf("FromHeaderField(%q) accepted", bad)
		}
	}
}

func TestOwnerKeyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "orrery-owner", "owner.pem")
	authorize := Authorize(FromFile(path))
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	if err := authorize(pub); err == nil || !strings.Contains(err.Error(), "does not know its owner yet") {
		t.Fatalf("before the node knows its owner: %v", err)
	}
	// bootstrapperd writes it under UMask=0077.
	defer syscall.Umask(syscall.Umask(0o077))
	if err := Write(path, pub); err != nil {
		t.Fatal(err)
	}
	if err := authorize(pub); err != nil {
		t.Fatalf("the owner was refused: %v", err)
	}
	// The service reads it as a user of its own.
	for p, want := range map[string]os.FileMode{path: 0o004, filepath.Dir(path): 0o005} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm()&want != want {
			t.Errorf("%s: %v; want others to have %v", p, err, want)
		}
	}
	other, _, _ := ed25519.GenerateKey(rand.Reader)
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	for name, k := range map[string]any{"another Ed25519 key": other, "an ECDSA key": &ec.PublicKey, "no key": nil} {
		if err := authorize(k); err == nil {
			t.Errorf("%s was authorized", name)
		}
	}
	for name, content := range map[string]string{
		"empty":      "",
		"truncated":  "-----BEGIN ORRERY OWNER ACCESS KEY-----\nAAAA\n-----END ORRERY OWNER ACCESS KEY-----\n",
		"other type": "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n-----END PUBLIC KEY-----\n",
	} {
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := Read(path); err == nil {
			t.Errorf("%s key file read", name)
		}
		if err := authorize(pub); err == nil {
			t.Errorf("%s key file: the former owner was authorized", name)
		}
	}
	if err := Write(path, pub[:31]); err == nil {
		t.Error("a 31-byte key was written")
	}
}
