package servingca

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

func TestNewMakesAPairCheckAccepts(t *testing.T) {
	now := time.Now()
	cert, key, err := New(now)
	if err != nil {
		t.Fatal(err)
	}
	if err := Check(cert, key, now); err != nil {
		t.Fatalf("Check of a new pair: %v", err)
	}
	otherCert, otherKey, err := New(now)
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		cert, key []byte
		at        time.Time
	}{
		"another's key":          {cert, otherKey, now},
		"key for certificate":    {key, cert, now},
		"two certificates":       {append(bytes.Clone(cert), otherCert...), key, now},
		"empty":                  {nil, nil, now},
		"not yet valid":          {cert, key, now.Add(-time.Hour)},
		"expired":                {cert, key, now.Add(11 * 365 * 24 * time.Hour)},
		"over the size of pairs": {bytes.Repeat([]byte("a"), MaxPEM+1), key, now},
	} {
		err := Check(c.cert, c.key, c.at)
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
		if err != nil && bytes.Contains([]byte(err.Error()), key) {
			t.Errorf("%s: the error holds the key", name)
		}
	}
}

// Check reads what the owner sends a node: whatever it is given, it
// answers, never panics, and never says the key.
func FuzzCheck(f *testing.F) {
	cert, key, err := New(time.Now())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(cert, key)
	f.Add(cert[:len(cert)/2], key)
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), []byte{})
	f.Fuzz(func(t *testing.T, c, k []byte) {
		err := Check(c, k, time.Now())
		if err != nil && len(k) > 40 && bytes.Contains([]byte(err.Error()), k) {
			t.Fatal("the error holds the key")
		}
	})
}
