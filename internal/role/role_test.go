package role

import "testing"

func TestValidate(t *testing.T) {
	for r, ok := range map[Role]bool{
		ControlPlane: true, Worker: true,
		"": false, "master": false, "Control-Plane": false, "worker ": false,
	} {
		if err := r.Validate(); (err == nil) != ok {
			t.Errorf("Role(%q).Validate() = %v, want valid %v", r, err, ok)
		}
	}
}
