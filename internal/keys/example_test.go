package keys_test

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"log"

	"github.com/orrery-dev/orrery/internal/keys"
)

// A fresh master secret yields one key per state disk. The key depends only
// on the secret and the disk's UUID, however the UUID is spelled.
func ExampleMasterSecret_DiskKey() {
	ms, err := keys.GenerateMasterSecret(rand.Reader)
	if err != nil {
		log.Fatal(err)
	}

	diskKey, err := ms.DiskKey("0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f")
	if err != nil {
		log.Fatal(err)
	}
	again, err := ms.DiskKey("0B5C1F3E-8D2A-4C6B-9E7F-1A2B3C4D5E6F")
	if err != nil {
		log.Fatal(err)
	}

	fmt.Println("disk key bytes:", len(diskKey))
	fmt.Println("same key for the upper-case UUID:", bytes.Equal(diskKey, again))
	// Output:
	// disk key bytes: 32
	// same key for the upper-case UUID: true
}
