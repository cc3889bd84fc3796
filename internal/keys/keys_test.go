package keys

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
)

// seq returns the bytes from, from+1, ..., to-1.
func seq(from, to int) []byte {
	b := make([]byte, 0, to-from)
	for i := from; i < to; i++ {
		b = append(b, byte(i))
	}
	return b
}

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("bad hex in test: %v", err)
	}
	return b
}

// testSecret is the fixed master secret of the known-answer tests.
func testSecret() MasterSecret {
	return MasterSecret{Key: seq(0x00, 0x20), Salt: seq(0x20, 0x40)}
}

// TestRFC5869 runs the SHA-256 test cases of RFC 5869, appendix A, through
// the helper every derivation uses.
func TestRFC5869(t *testing.T) {
	testCases := map[string]struct {
		ikm, salt, info string
		length          int
		okm             string
	}{
		"test case 1: basic": {
			ikm:    "0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b",
			salt:   "000102030405060708090a0b0c",
			info:   "f0f1f2f3f4f5f6f7f8f9",
			length: 42,
			okm: "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf" +
				"34007208d5b887185865",
		},
		"test case 2: longer inputs and outputs": {
			ikm: "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f" +
				"202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f" +
				"404142434445464748494a4b4c4d4e4f",
			salt: "606162636465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f" +
				"808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9f" +
				"a0a1a2a3a4a5a6a7a8a9aaabacadaeaf",
			info: "b0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0c1c2c3c4c5c6c7c8c9cacbcccdcecf" +
				"d0d1d2d3d4d5d6d7d8d9dadbdcdddedfe0e1e2e3e4e5e6e7e8e9eaebecedeeef" +
				"f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff",
			length: 82,
			okm: "b11e398dc80327a1c8e7f78c596a49344f012eda2d4efad8a050cc4c19afa97c" +
				"59045a99cac7827271cb41c65e590e09da3275600c2f09b8367793a9aca3db71" +
				"cc30c58179ec3e87c14c01d5c1f3434f1d87",
		},
		"test case 3: empty salt and info": {
			ikm:    "0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b",
			salt:   "",
			info:   "",
			length: 42,
			okm: "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d" +
				"9d201395faa4b61a96c8",
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			got, err := derive(mustHex(t, tc.ikm), mustHex(t, tc.salt), string(mustHex(t, tc.info)), tc.length)
			if err != nil {
				t.Fatalf("derive: %v", err)
			}
			if want := mustHex(t, tc.okm); !bytes.Equal(got, want) {
				t.Errorf("OKM = %x, want %x", got, want)
			}
		})
	}
}

func TestDeriveKey(t *testing.T) {
	testCases := map[string]struct {
		ms      MasterSecret
		keyID   string
		length  int
		wantErr string
	}{
		"shortest key":    {ms: testSecret(), keyID: "a", length: MinKeyLength},
		"longest key":     {ms: testSecret(), keyID: "a", length: MaxKeyLength},
		"empty key ID":    {ms: testSecret(), keyID: "", length: 32, wantErr: "key ID is empty"},
		"too short":       {ms: testSecret(), keyID: "a", length: 15, wantErr: "must be 16 to 64 bytes"},
		"too long":        {ms: testSecret(), keyID: "a", length: 65, wantErr: "must be 16 to 64 bytes"},
		"zero length":     {ms: testSecret(), keyID: "a", length: 0, wantErr: "must be 16 to 64 bytes"},
		"negative length": {ms: testSecret(), keyID: "a", length: -1, wantErr: "must be 16 to 64 bytes"},
		"short master key": {
			ms: MasterSecret{Key: seq(0, 31), Salt: seq(0, 32)}, keyID: "a", length: 32,
			wantErr: "master key has 31 bytes, want 32",
		},
		"long master salt": {
			ms: MasterSecret{Key: seq(0, 32), Salt: seq(0, 33)}, keyID: "a", length: 32,
			wantErr: "master salt has 33 bytes, want 32",
		},
		"zero master secret": {
			keyID: "a", length: 32, wantErr: "master key has 0 bytes",
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			got, err := tc.ms.DeriveKey(tc.keyID, tc.length)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("DeriveKey() error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("DeriveKey() error = %v", err)
			}
			if len(got) != tc.length {
				t.Errorf("len(key) = %d, want %d", len(got), tc.length)
			}
		})
	}
}

func TestDeriveKeySeparatesIDs(t *testing.T) {
	ms := testSecret()
	a, err := ms.DeriveKey("a", 32)
	if err != nil {
		t.Fatal(err)
	}
	b, err := ms.DeriveKey("b", 32)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(a, b) {
		t.Error("two key IDs gave the same key")
	}
}

func TestDiskKey(t *testing.T) {
	const lower = "0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f"
	testCases := map[string]struct {
		uuid    string
		wantErr string
	}{
		"lower case":         {uuid: lower},
		"upper case":         {uuid: strings.ToUpper(lower)},
		"mixed case":         {uuid: "0B5c1F3e-8D2a-4C6b-9E7f-1A2b3C4d5E6f"},
		"empty":              {uuid: "", wantErr: "disk UUID is empty"},
		"nil UUID":           {uuid: "00000000-0000-0000-0000-000000000000", wantErr: "nil UUID"},
		"too short":          {uuid: lower[:35], wantErr: "malformed"},
		"too long":           {uuid: lower + "0", wantErr: "malformed"},
		"no dashes":          {uuid: strings.ReplaceAll(lower, "-", "") + "0000", wantErr: "malformed"},
		"dash misplaced":     {uuid: "0b5c1f3e8-d2a-4c6b-9e7f-1a2b3c4d5e6f", wantErr: "malformed"},
		"not hex":            {uuid: "0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6g", wantErr: "malformed"},
		"braces":             {uuid: "{0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6}", wantErr: "malformed"},
		"trailing newline":   {uuid: lower[:35] + "\n", wantErr: "malformed"},
		"surrounding spaces": {uuid: " " + lower[1:35] + " ", wantErr: "malformed"},
		"non-ASCII":          {uuid: "0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5é", wantErr: "malformed"},
	}
	ms := testSecret()
	want, err := ms.DeriveKey("disk:"+lower, DiskKeySize)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			got, err := ms.DiskKey(tc.uuid)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("DiskKey(%q) error = %v, want one containing %q", tc.uuid, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("DiskKey(%q) error = %v", tc.uuid, err)
			}
			// Every spelling of the UUID must open the same disk.
			if !bytes.Equal(got, want) {
				t.Errorf("DiskKey(%q) = %x, want %x", tc.uuid, got, want)
			}
		})
	}
}

func TestDiskKeysDiffer(t *testing.T) {
	ms := testSecret()
	a, err := ms.DiskKey("0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f")
	if err != nil {
		t.Fatal(err)
	}
	b, err := ms.DiskKey("0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e70")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(a, b) {
		t.Error("two disk UUIDs gave the same key")
	}
	other := MasterSecret{Key: seq(0x80, 0xa0), Salt: ms.Salt}
	c, err := other.DiskKey("0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(a, c) {
		t.Error("two master keys gave the same disk key")
	}
}

func TestClusterID(t *testing.T) {
	secret, salt := seq(0x00, 0x20), seq(0x40, 0x60)
	testCases := map[string]struct {
		secret, salt []byte
		wantErr      string
	}{
		"valid":        {secret: secret, salt: salt},
		"short secret": {secret: secret[:31], salt: salt, wantErr: "measurement secret has 31 bytes, want 32"},
		"long secret":  {secret: append(seq(0, 32), 0), salt: salt, wantErr: "measurement secret has 33 bytes, want 32"},
		"nil secret":   {secret: nil, salt: salt, wantErr: "measurement secret has 0 bytes"},
		"short salt":   {secret: secret, salt: salt[:16], wantErr: "measurement salt has 16 bytes, want 32"},
		"nil salt":     {secret: secret, salt: nil, wantErr: "measurement salt has 0 bytes"},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			got, err := ClusterID(tc.secret, tc.salt)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ClusterID() error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ClusterID() error = %v", err)
			}
			if len(got) != 32 {
				t.Errorf("len(cluster ID) = %d, want 32", len(got))
			}
		})
	}
}

// TestClusterIDWithoutMasterSalt plays the first node, which holds the
// master secret, and a joining node, which holds only the measurement
// secret and salt: both must get the same ID, and the ID must not be the
// one the master salt would give.
func TestClusterIDWithoutMasterSalt(t *testing.T) {
	ms := testSecret()
	measurementSalt := seq(0x40, 0x60)

	measurementSecret, err := ms.MeasurementSecret()
	if err != nil {
		t.Fatal(err)
	}
	first, err := ClusterID(measurementSecret, measurementSalt)
	if err != nil {
		t.Fatal(err)
	}

	// The joining node gets copies, never the master secret.
	joining, err := ClusterID(bytes.Clone(measurementSecret), bytes.Clone(measurementSalt))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(first, joining) {
		t.Errorf("joining node computed cluster ID %x, first node %x", joining, first)
	}

	withMasterSalt, err := derive(measurementSecret, ms.Salt, InfoClusterID, 32)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(first, withMasterSalt) {
		t.Error("cluster ID equals the one derived with the master salt")
	}
}

func TestGenerateMasterSecret(t *testing.T) {
	testCases := map[string]struct {
		r       io.Reader
		wantErr string
	}{
		"enough bytes":   {r: bytes.NewReader(seq(0, 64))},
		"no bytes":       {r: bytes.NewReader(nil), wantErr: "generate master key"},
		"too few bytes":  {r: bytes.NewReader(seq(0, 40)), wantErr: "generate master salt"},
		"one byte short": {r: bytes.NewReader(seq(0, 63)), wantErr: "unexpected EOF"},
		"nil reader":     {r: nil, wantErr: "no random source"},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			ms, err := GenerateMasterSecret(tc.r)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("GenerateMasterSecret() error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("GenerateMasterSecret() error = %v", err)
			}
			if !bytes.Equal(ms.Key, seq(0, 32)) || !bytes.Equal(ms.Salt, seq(32, 64)) {
				t.Errorf("GenerateMasterSecret() = %x/%x, want the reader's bytes in order", ms.Key, ms.Salt)
			}
		})
	}
}

func TestGenerateFromCryptoRand(t *testing.T) {
	ms, err := GenerateMasterSecret(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if err := ms.Validate(); err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(ms.Key, ms.Salt) {
		t.Error("key and salt are equal")
	}
	salt, err := GenerateSalt(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if len(salt) != SaltSize {
		t.Errorf("len(salt) = %d, want %d", len(salt), SaltSize)
	}
}

func TestGenerateSalt(t *testing.T) {
	testCases := map[string]struct {
		r       io.Reader
		wantErr string
	}{
		"enough bytes":  {r: bytes.NewReader(seq(0, 32))},
		"too few bytes": {r: bytes.NewReader(seq(0, 31)), wantErr: "generate measurement salt"},
		"nil reader":    {r: nil, wantErr: "no random source"},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			salt, err := GenerateSalt(tc.r)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("GenerateSalt() error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("GenerateSalt() error = %v", err)
			}
			if !bytes.Equal(salt, seq(0, 32)) {
				t.Errorf("GenerateSalt() = %x, want the reader's bytes", salt)
			}
		})
	}
}

// TestMasterSecretRedacted guards against the secret reaching a log line
// through fmt or slog.
func TestMasterSecretRedacted(t *testing.T) {
	ms := testSecret()
	var out bytes.Buffer
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%x", "%q"} {
		fmt.Fprintf(&out, verb+"\n", ms)
	}
	slog.New(slog.NewJSONHandler(&out, nil)).Info("test", "secret", ms)
	slog.New(slog.NewTextHandler(&out, nil)).Info("test", "secret", ms)

	for _, leak := range []string{
		hex.EncodeToString(ms.Key[:8]),
		base64.StdEncoding.EncodeToString(ms.Key)[:8],
		fmt.Sprint(ms.Key[:8])[1:10],
	} {
		if strings.Contains(out.String(), leak) {
			t.Errorf("output contains %q:\n%s", leak, out.String())
		}
	}
}
