package variant

import "testing"

func TestLookup(t *testing.T) {
	v, err := FromString("qemu-vtpm")
	if err != nil || v != QEMUVTPM {
		t.Fatalf("FromString(qemu-vtpm) = %v, %v", v, err)
	}
	v, err = FromOID(QEMUVTPM.OID())
	if err != nil || v != QEMUVTPM {
		t.Fatalf("FromOID = %v, %v", v, err)
	}
	if _, err := FromString("sev-snp-on-a-toaster"); err == nil {
		t.Fatal("unknown name accepted")
	}
	if _, err := FromOID("1.2.3"); err == nil {
		t.Fatal("unknown OID accepted")
	}
}
