package platformca

import (
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"strings"
	"testing"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/tpm/swtpm/swtpmtest"
)

func TestProvisionAKNamesInstance(t *testing.T) {
	ca, err := New("test")
	if err != nil {
		t.Fatal(err)
	}
	tpm := swtpmtest.Start(t)
	rw := swtpmtest.Open(t, tpm)
	defer rw.Close()

	inst := NewInstance("cp-0")
	cert, err := ca.ProvisionAK(rw, inst)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := InstanceOf(cert); err != nil || got != inst {
		t.Fatalf("InstanceOf = %v, %v; want %v", got, err, inst)
	}
	if cert.Subject.CommonName != "cp-0" || cert.Subject.SerialNumber != inst.ID {
		t.Errorf("subject %v does not show the instance", cert.Subject)
	}
	if err := cert.CheckSignatureFrom(ca.Cert); err != nil {
		t.Fatal(err)
	}

	// Provisioning without an instance is what old VMs have.
	old, err := ca.ProvisionAK(rw, attestation.Instance{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := InstanceOf(old); !errors.Is(err, ErrNoInstance) || !strings.Contains(err.Error(), "recreate the VM") {
		t.Fatalf("InstanceOf(old certificate) = %v, want ErrNoInstance saying to recreate the VM", err)
	}

	// The platform certifies no name Kubernetes would refuse.
	for _, bad := range []attestation.Instance{{Name: "Worker_0", ID: "1"}, {Name: "w", ID: ""}, {Name: "w", ID: "a b"}} {
		if _, err := ca.ProvisionAK(rw, bad); err == nil {
			t.Errorf("ProvisionAK certified %v", bad)
		}
	}
}

func TestNewInstanceIDsDiffer(t *testing.T) {
	a, b := NewInstance("w"), NewInstance("w")
	if a.ID == b.ID || CheckInstance(a) != nil || CheckInstance(b) != nil {
		t.Fatalf("NewInstance gave %v and %v", a, b)
	}
}

func rdns(t testing.TB, atvs ...pkix.AttributeTypeAndValue) []byte {
	var seq pkix.RDNSequence
	for _, a := range atvs {
		seq = append(seq, pkix.RelativeDistinguishedNameSET{a})
	}
	der, err := asn1.Marshal(seq)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func TestParseInstanceSubject(t *testing.T) {
	cn := func(v any) pkix.AttributeTypeAndValue {
		return pkix.AttributeTypeAndValue{Type: oidCommonName, Value: v}
	}
	sn := func(v any) pkix.AttributeTypeAndValue {
		return pkix.AttributeTypeAndValue{Type: oidSerialNumber, Value: v}
	}
	org := pkix.AttributeTypeAndValue{Type: asn1.ObjectIdentifier{2, 5, 4, 10}, Value: "Orrery"}
	good := rdns(t, cn("worker-0"), sn("123"))
	tests := map[string]struct {
		der     []byte
		want    attestation.Instance
		wantErr string
	}{
		"instance":                {der: good, want: attestation.Instance{Name: "worker-0", ID: "123"}},
		"other attributes":        {der: rdns(t, org, sn("123"), cn("worker-0")), want: attestation.Instance{Name: "worker-0", ID: "123"}},
		"old certificate":         {der: rdns(t, cn("Orrery local cloud vTPM attestation key")), wantErr: "recreate the VM"},
		"empty subject":           {der: rdns(t), wantErr: "names no instance"},
		"two common names":        {der: rdns(t, cn("worker-0"), cn("cp-0"), sn("123")), wantErr: "2 common names"},
		"two serial numbers":      {der: rdns(t, cn("worker-0"), sn("1"), sn("2")), wantErr: "2 serial numbers"},
		"serial without name":     {der: rdns(t, sn("1")), wantErr: "0 common names"},
		"name Kubernetes refuses": {der: rdns(t, cn("Worker_0"), sn("1")), wantErr: "not a valid node name"},
		"ID with a space":         {der: rdns(t, cn("worker-0"), sn("1 2")), wantErr: "character"},
		"integer ID":              {der: rdns(t, cn("worker-0"), sn(7)), wantErr: "not a string"},
		"trailing data":           {der: append(good, 0), wantErr: "trailing data"},
		"truncated":               {der: good[:len(good)-1], wantErr: "decode"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseInstanceSubject(tc.der)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !got.IsZero() {
					t.Fatalf("got %v, %v; want an error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// FuzzParseInstanceSubject feeds arbitrary bytes as an AK certificate's
// subject: no panic, and whatever it accepts is an instance the platform
// could have certified.
func FuzzParseInstanceSubject(f *testing.F) {
	cn := pkix.AttributeTypeAndValue{Type: oidCommonName, Value: "worker-0"}
	sn := pkix.AttributeTypeAndValue{Type: oidSerialNumber, Value: "4242"}
	f.Add(rdns(f, cn, sn))
	f.Add(rdns(f, cn))
	f.Add(rdns(f, cn, sn, sn))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, der []byte) {
		inst, err := ParseInstanceSubject(der)
		if err != nil {
			if !inst.IsZero() {
				t.Fatalf("refused (%v) but returned %v", err, inst)
			}
			return
		}
		if err := CheckInstance(inst); err != nil {
			t.Fatalf("accepted %v: %v", inst, err)
		}
		if strings.ContainsFunc(inst.Name+inst.ID, func(r rune) bool { return r < 0x21 || r > 0x7e }) {
			t.Fatalf("accepted non-printable instance %q", inst)
		}
	})
}
