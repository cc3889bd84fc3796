package controlplanes

import (
	"slices"
	"strings"
	"testing"

	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
)

func TestParse(t *testing.T) {
	tests := map[string]struct {
		in      string
		want    []string
		wantErr string
	}{
		"empty":              {in: "", want: nil},
		"one":                {in: "123", want: []string{"123"}},
		"lines and commas":   {in: "1\n2, 3\t4\r\n", want: []string{"1", "2", "3", "4"}},
		"comments":           {in: "# approved by the owner\n1 # cp-0\n#2\n", want: []string{"1"}},
		"bad character":      {in: "12;rm", wantErr: "character"},
		"too long":           {in: strings.Repeat("1", 65), wantErr: "want 1 to 64"},
		"non-ASCII space ok": {in: "1\u00a02", want: []string{"1", "2"}},
		"too many":           {in: strings.Repeat("1 ", MaxIDs+1), wantErr: "more than"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := Parse(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestApprove(t *testing.T) {
	text, added, err := Approve("", "11")
	if err != nil || !added || text != "11\n" {
		t.Fatalf("Approve on empty = %q, %v, %v", text, added, err)
	}
	// A line ending in a comment does not swallow the new ID.
	text, added, err = Approve("11 # cp-0", "22")
	if err != nil || !added {
		t.Fatal(added, err)
	}
	if ids, _ := Parse(text); !slices.Equal(ids, []string{"11", "22"}) {
		t.Fatalf("approved list %q parses to %q", text, ids)
	}
	if again, added, err := Approve(text, "22"); err != nil || added || again != text {
		t.Fatalf("approving twice changed the list: %q, %v, %v", again, added, err)
	}
	if _, _, err := Approve(text, "2 2"); err == nil {
		t.Fatal("an invalid ID was approved")
	}
	if _, _, err := Approve("bad;id", "3"); err == nil {
		t.Fatal("a list that does not parse was extended")
	}
}

// FuzzParse feeds arbitrary text as the list: no panic, every ID accepted
// is one the platform could issue, and Approve keeps what was there.
func FuzzParse(f *testing.F) {
	f.Add("1111\n2222 # cp-1\n")
	f.Add("1,2,3")
	f.Add("# only a comment")
	f.Add("a b\x00c")
	f.Fuzz(func(t *testing.T, text string) {
		ids, err := Parse(text)
		if err != nil {
			return
		}
		for _, id := range ids {
			if err := platformca.CheckInstanceID(id); err != nil {
				t.Fatalf("accepted %q: %v", id, err)
			}
		}
		more, _, err := Approve(text, "4242")
		if err != nil {
			if len(ids) == MaxIDs {
				return
			}
			t.Fatalf("Approve on a list that parses: %v", err)
		}
		got, err := Parse(more)
		if err != nil || !slices.Contains(got, "4242") || len(got) < len(ids) {
			t.Fatalf("after Approve: %q, %v", got, err)
		}
	})
}

func TestRevoke(t *testing.T) {
	text := "# approved by the owner\n1111\n2222, 3333 # the second batch\n2222\n"
	got, removed, err := Revoke(text, "2222")
	if err != nil || !removed {
		t.Fatalf("Revoke: %v, removed %v", err, removed)
	}
	if want := "# approved by the owner\n1111\n3333 # the second batch\n"; got != want {
		t.Fatalf("Revoke left %q, want %q", got, want)
	}
	ids, err := Parse(got)
	if err != nil || strings.Join(ids, " ") != "1111 3333" {
		t.Fatalf("after Revoke the list is %v, %v", ids, err)
	}
	if same, removed, err := Revoke(got, "4444"); err != nil || removed || same != got {
		t.Fatalf("revoking an ID not in the list: %q, %v, %v", same, removed, err)
	}
	if _, _, err := Revoke(got, "no id"); err == nil {
		t.Fatal("an invalid instance ID was taken")
	}
}
