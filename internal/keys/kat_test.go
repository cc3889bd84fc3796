package keys

import (
	"bytes"
	"crypto/ed25519"
	"testing"
)

// Known answers for the derivations, computed by testdata/kat.py, an
// independent HKDF-SHA256 written with Python's hmac and hashlib only (the
// disk key, measurement secret and cluster ID were also checked against
// `openssl kdf ... HKDF`). To reproduce them, run
//
//	python3 internal/keys/testdata/kat.py
//
// If this test fails, the derivation changed, and every existing cluster
// would lose its disks: change the code back, not these values.
const (
	katDataKey16         = "439004b8f46d7b2bf95393b2f9abe364"
	katDataKey64         = "439004b8f46d7b2bf95393b2f9abe3647d904a60ad17fd11386b6625ed3cb4f35b777e487bead142154b5709e524b6f56ea0216451118ef75cdbd09893b04f46"
	katDiskKey           = "c1971c461d49a0891732a2c2a117a0ce6d2070aff8ec825a5ee684b3fb0aeb53"
	katMeasurementSecret = "dda45f6fdf2b38253a1fd78f8d37a1959fe47ca9b2329376b08ffce53bf373fb"
	katClusterID         = "639fd088a0375d88b836eec6459cf0426883c9013e5e13217b19df1876a854cc"
	katOwnerAccessKey    = "75361ae9e2a434ee3e633ee7a24e31c19a9bbfda91526163950c8b7c313806e5"
)

// Inputs of testdata/kat.py; the master secret is testSecret().
const (
	katDataKeyID = "kat-key"
	// Upper case on purpose: kat.py derives from the lower-case form.
	katDiskUUID = "0B5C1F3E-8D2A-4C6B-9E7F-1A2B3C4D5E6F"
)

func katMeasurementSalt() []byte { return seq(0x40, 0x60) }

func TestKnownAnswers(t *testing.T) {
	ms := testSecret()
	testCases := map[string]struct {
		derive func() ([]byte, error)
		want   string
	}{
		"data key, 16 bytes": {
			derive: func() ([]byte, error) { return ms.DeriveKey(katDataKeyID, 16) },
			want:   katDataKey16,
		},
		"data key, 64 bytes": {
			derive: func() ([]byte, error) { return ms.DeriveKey(katDataKeyID, 64) },
			want:   katDataKey64,
		},
		"disk key": {
			derive: func() ([]byte, error) { return ms.DiskKey(katDiskUUID) },
			want:   katDiskKey,
		},
		"measurement secret": {
			derive: ms.MeasurementSecret,
			want:   katMeasurementSecret,
		},
		"cluster ID": {
			derive: func() ([]byte, error) {
				secret, err := ms.MeasurementSecret()
				if err != nil {
					return nil, err
				}
				return ClusterID(secret, katMeasurementSalt())
			},
			want: katClusterID,
		},
		"owner access key (public half)": {
			derive: func() ([]byte, error) {
				k, err := ms.OwnerAccessKey()
				if err != nil {
					return nil, err
				}
				return k.Public().(ed25519.PublicKey), nil
			},
			want: katOwnerAccessKey,
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			got, err := tc.derive()
			if err != nil {
				t.Fatalf("derive: %v", err)
			}
			if want := mustHex(t, tc.want); !bytes.Equal(got, want) {
				t.Errorf("got  %x\nwant %x", got, want)
			}
		})
	}
}
