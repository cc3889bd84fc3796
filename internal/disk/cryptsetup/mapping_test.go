package cryptsetup

import (
	"errors"
	"strings"
	"testing"
)

// Device-mapper tables of /dev/mapper/state as 'dmsetup table state'
// prints them (dm-crypt's STATUSTYPE_TABLE, key masked by dmsetup or a
// keyring reference): the crypt target sits on the dm-integrity device
// (253:0) that keeps the tags, from its sector 0.
const (
	authenc      = "capi:authenc(hmac(sha256),xts(aes))-plain64"
	keyringKey   = ":96:logon:cryptsetup:0b6e1a52-6f7c-4f0e-9d7e-3c1f2a4b5c6d-d0"
	stateTable   = "0 20905984 crypt " + authenc + " " + keyringKey + " 0 253:0 0 2 integrity:32:aead sector_size:4096\n"
	hexKeyLength = 2 * 96
)

func TestCheckTable(t *testing.T) {
	masked := strings.Repeat("0", hexKeyLength)
	secret := strings.Repeat("0123456789abcdef", hexKeyLength/16)
	tests := map[string]struct {
		table string
		field string // "" for accepted
	}{
		"keyring key": {table: stateTable},
		"masked key":  {table: strings.Replace(stateTable, keyringKey, masked, 1)},
		"options in another order": {
			table: strings.Replace(stateTable, "integrity:32:aead sector_size:4096", "sector_size:4096 integrity:32:aead", 1),
		},
		"no trailing newline": {table: strings.TrimSpace(stateTable)},

		// What a header rewritten as in /tmp/review/poc/nullsegment.py maps.
		"cipher_null": {table: "0 20905984 crypt cipher_null-ecb - 0 254:16 32768 1 sector_size:4096\n", field: "cipher"},
		"no integrity": {
			table: "0 20905984 crypt aes-xts-plain64 " + strings.Repeat("0", 128) + " 0 254:16 32768 1 sector_size:4096\n",
			field: "cipher",
		},
		"other AEAD": {table: strings.Replace(stateTable, authenc, "capi:gcm(aes)-random", 1), field: "cipher"},
		"no integrity option": {
			table: strings.Replace(stateTable, "2 integrity:32:aead sector_size:4096", "1 sector_size:4096", 1), field: "options",
		},
		"short tags": {table: strings.Replace(stateTable, "integrity:32:aead", "integrity:16:aead", 1), field: "options"},
		"512-byte sectors": {
			table: strings.Replace(stateTable, "2 integrity:32:aead sector_size:4096", "1 integrity:32:aead", 1), field: "options",
		},
		"allow_discards": {
			table: strings.Replace(stateTable, "2 integrity", "3 allow_discards integrity", 1), field: "options",
		},
		"option count off": {table: strings.Replace(stateTable, "2 integrity", "3 integrity", 1), field: "options"},
		"two targets": {
			table: stateTable + "20905984 8 linear 254:16 0\n", field: "targets",
		},
		"linear":     {table: "0 20905984 linear 254:16 32768\n", field: "target"},
		"other type": {table: strings.Replace(stateTable, " crypt ", " verity ", 1), field: "target"},
		"not from 0": {table: "8" + stateTable[1:], field: "start"},
		"iv offset":  {table: strings.Replace(stateTable, keyringKey+" 0 ", keyringKey+" 8 ", 1), field: "iv_offset"},
		"offset":     {table: strings.Replace(stateTable, "253:0 0 ", "253:0 32768 ", 1), field: "offset"},
		"device":     {table: strings.Replace(stateTable, "253:0", "/dev/vdb", 1), field: "device"},
		"short key":  {table: strings.Replace(stateTable, ":96:", ":64:", 1), field: "key"},
		"short masked key": {
			table: strings.Replace(stateTable, keyringKey, strings.Repeat("0", 128), 1), field: "key",
		},
		"key shown": {table: strings.Replace(stateTable, keyringKey, secret, 1), field: "key"},
		"empty":     {table: "", field: "targets"},
		"truncated": {table: "0 20905984 crypt " + authenc + "\n", field: "target"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := StateDisk.CheckTable("state", []byte(tc.table))
			if tc.field == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var fe *FormatError
			if !errors.As(err, &fe) || fe.Field != tc.field {
				t.Fatalf("err = %v, want a FormatError for %s", err, tc.field)
			}
			if strings.Contains(err.Error(), secret[:32]) {
				t.Fatalf("the error shows the key: %v", err)
			}
			if !strings.HasPrefix(err.Error(), "device-mapper table of state: "+tc.field+" is ") {
				t.Errorf("err = %v", err)
			}
		})
	}
}

// A volume without integrity maps its cipher as it is, on the disk
// itself, past the header.
func TestCheckTableWithoutIntegrity(t *testing.T) {
	table := "0 65536 crypt aes-xts-plain64 " + strings.Repeat("0", 128) + " 0 254:16 32768 1 sector_size:4096\n"
	if err := encryptedOnly.CheckTable("state", []byte(table)); err != nil {
		t.Error(err)
	}
	if err := StateDisk.CheckTable("state", []byte(table)); err == nil {
		t.Error("a table without integrity passed as a state disk's")
	}
}

func FuzzCheckTable(f *testing.F) {
	f.Add(stateTable)
	f.Add(strings.Replace(stateTable, keyringKey, strings.Repeat("0", hexKeyLength), 1))
	f.Add("0 20905984 crypt cipher_null-ecb - 0 254:16 32768 1 sector_size:4096\n")
	f.Fuzz(func(t *testing.T, table string) {
		err := StateDisk.CheckTable("state", []byte(table))
		if err == nil {
			if !strings.Contains(table, " crypt "+authenc+" ") || !strings.Contains(table, "integrity:32:aead") {
				t.Fatalf("accepted %q", table)
			}
			return
		}
		var fe *FormatError
		if !errors.As(err, &fe) {
			t.Fatalf("not a FormatError: %v", err)
		}
		// The key field never reaches what the error says it saw (but
		// for a keyring reference's size), unless another field, as
		// the error quotes it, holds the same text.
		f := strings.Split(strings.TrimSuffix(table, "\n"), " ")
		if len(f) <= 4 || len(f[4]) < 8 || strings.HasPrefix(f[4], ":") {
			return
		}
		for i, field := range f {
			if i != 4 && strings.Contains(quote(field), f[4]) {
				return
			}
		}
		if strings.Contains(fe.Got, f[4]) {
			t.Fatalf("the error shows the key field: %v", err)
		}
	})
}
