package nodelock_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-tpm/legacy/tpm2"

	"github.com/orrery-dev/orrery/internal/nodelock"
	"github.com/orrery-dev/orrery/internal/tpm/pcrlog"
	"github.com/orrery-dev/orrery/internal/tpm/swtpm/swtpmtest"
)

func TestExactlyOneOfManyWins(t *testing.T) {
	tpm := swtpmtest.Start(t)
	log := &pcrlog.Log{Path: filepath.Join(t.TempDir(), "measurements.log")}
	lock := nodelock.New(tpm.Open, log)

	const racers = 50
	var wins atomic.Int32
	var winner atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < racers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			id := sha256.Sum256([]byte{byte(i)})
			ok, err := lock.TryLock(id[:])
			if err != nil {
				t.Error(err)
				return
			}
			if ok {
				wins.Add(1)
				winner.Store(int32(i))
			}
		}()
	}
	close(start)
	wg.Wait()
	if wins.Load() != 1 {
		t.Fatalf("%d goroutines took the lock, want exactly 1", wins.Load())
	}

	// PCR 15 = SHA-256(zeros || SHA-256(cluster ID)), computed here
	// without the code under test.
	id := sha256.Sum256([]byte{byte(winner.Load())})
	digest := sha256.Sum256(id[:])
	want := sha256.Sum256(append(make([]byte, 32), digest[:]...))
	rw := swtpmtest.Open(t, tpm)
	got, err := tpm2.ReadPCR(rw, 15, tpm2.AlgSHA256)
	if err != nil {
		t.Fatal(err)
	}
	rw.Close()
	if !bytes.Equal(got, want[:]) {
		t.Fatalf("PCR 15 = %x, want %x", got, want)
	}

	entries, err := pcrlog.Read(log.Path)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].PCR != 15 {
		t.Fatalf("measurement log = %+v, want one PCR 15 entry", entries)
	}

	// A new process (a new Lock on the same TPM) sees the lock.
	again := nodelock.New(tpm.Open, log)
	if locked, err := again.IsLocked(); err != nil || !locked {
		t.Fatalf("IsLocked after restart = %v, %v; want true", locked, err)
	}
	if ok, err := again.TryLock(id[:]); err != nil || ok {
		t.Fatalf("TryLock after restart = %v, %v; want false", ok, err)
	}
}

func TestFreshNodeIsUnlocked(t *testing.T) {
	tpm := swtpmtest.Start(t)
	lock := nodelock.New(tpm.Open, &pcrlog.Log{Path: filepath.Join(t.TempDir(), "m.log")})
	if locked, err := lock.IsLocked(); err != nil || locked {
		t.Fatalf("IsLocked on a fresh TPM = %v, %v", locked, err)
	}
	if _, err := lock.TryLock(nil); err == nil {
		t.Fatal("empty cluster ID accepted")
	}
}

func TestLockedToTellsOwnLockFromAnothers(t *testing.T) {
	tpm := swtpmtest.Start(t)
	lock := nodelock.New(tpm.Open, &pcrlog.Log{Path: filepath.Join(t.TempDir(), "m.log")})
	mine, theirs := []byte("cluster mine"), []byte("cluster theirs")
	if ok, err := lock.LockedTo(mine); err != nil || ok {
		t.Fatalf("LockedTo on a fresh TPM = %v, %v; want false", ok, err)
	}
	if ok, err := lock.TryLock(mine); err != nil || !ok {
		t.Fatalf("TryLock = %v, %v", ok, err)
	}
	// A restarted daemon, or a retried join, sees its own lock.
	again := nodelock.New(tpm.Open, &pcrlog.Log{Path: filepath.Join(t.TempDir(), "m.log")})
	if ok, err := again.LockedTo(mine); err != nil || !ok {
		t.Fatalf("LockedTo(own cluster) = %v, %v; want true", ok, err)
	}
	if ok, err := again.LockedTo(theirs); err != nil || ok {
		t.Fatalf("LockedTo(other cluster) = %v, %v; want false", ok, err)
	}
	rw := swtpmtest.Open(t, tpm)
	got, err := tpm2.ReadPCR(rw, 15, tpm2.AlgSHA256)
	rw.Close()
	if err != nil || !bytes.Equal(got, nodelock.Expected(mine)) {
		t.Fatalf("PCR 15 = %x (%v), Expected = %x", got, err, nodelock.Expected(mine))
	}
}

func TestCluster(t *testing.T) {
	tpm := swtpmtest.Start(t)
	log := &pcrlog.Log{Path: filepath.Join(t.TempDir(), "measurements.log")}
	lock := nodelock.New(tpm.Open, log)
	if _, err := lock.Cluster(); err == nil {
		t.Fatal("Cluster succeeded on a node that is not locked")
	}
	id := sha256.Sum256([]byte("cluster"))
	if ok, err := lock.TryLock(id[:]); !ok || err != nil {
		t.Fatalf("TryLock = %v, %v", ok, err)
	}
	got, err := lock.Cluster()
	if err != nil || !bytes.Equal(got, id[:]) {
		t.Fatalf("Cluster = %x, %v; want %x", got, err, id)
	}

	// A log that names another cluster than PCR 15 holds names nothing.
	other := sha256.Sum256([]byte("other"))
	forged := &pcrlog.Log{Path: filepath.Join(t.TempDir(), "forged.log")}
	if err := forged.Record(pcrlog.Entry{PCR: 15, Digests: map[string]string{"sha256": hex.EncodeToString(other[:])}, Description: "node lock: cluster ID " + hex.EncodeToString(other[:])}, func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := nodelock.New(tpm.Open, forged).Cluster(); err == nil {
		t.Error("Cluster believed a log that does not match PCR 15")
	}
}
