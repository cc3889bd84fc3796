package servingcsr

import (
	"slices"
	"sync"

	certv1 "k8s.io/api/certificates/v1"
)

// MaxRequestBytes bounds a request the approver reads: a kubelet's PEM
// request is under 1 KiB. A larger one is kept without its body, and
// denied.
const MaxRequestBytes = 16 << 10

// queue holds the pending requests to Signer, by requester, and hands
// them out one requester at a time.
type queue struct {
	mu     sync.Mutex
	byUser map[string][]queued
	// turn holds each requester with queued requests once, in the order
	// they are served.
	turn []string
	// ready has a value when a request was added since the last next.
	ready chan struct{}
}

// queued is a pending request; tooLarge is the size of a request body
// that was dropped for its size. overflow says its body was dropped
// because MaxPendingPerNode newer ones of its requester were queued: it
// is denied unread.
type queued struct {
	csr      *certv1.CertificateSigningRequest
	tooLarge int
	overflow bool
}

func newQueue() *queue {
	return &queue{byUser: map[string][]queued{}, ready: make(chan struct{}, 1)}
}

// add queues a copy of csr if it is a pending request to Signer: in its
// requester's queue, oldest first, in place of what was queued under its
// name before.
func (q *queue) add(csr *certv1.CertificateSigningRequest) {
	if csr.Spec.SignerName != Signer || !isPending(csr) {
		return
	}
	it := queued{csr: csr.DeepCopy()}
	if n := len(csr.Spec.Request); n > MaxRequestBytes {
		it.csr.Spec.Request, it.tooLarge = nil, n
	}
	user := csr.Spec.Username
	q.mu.Lock()
	list := slices.DeleteFunc(q.byUser[user], func(o queued) bool { return o.csr.Name == csr.Name })
	if len(list) == 0 && !slices.Contains(q.turn, user) {
		q.turn = append(q.turn, user)
	}
	at, _ := slices.BinarySearchFunc(list, it, olderFirst)
	list = slices.Insert(list, at, it)
	// Those with MaxPendingPerNode newer behind them will be denied
	// unread: a flood of requests need not be held whole in memory.
	for i := range len(list) - MaxPendingPerNode {
		if !list[i].overflow {
			list[i].csr.Spec.Request, list[i].overflow = nil, true
		}
	}
	q.byUser[user] = list
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

func olderFirst(a, b queued) int {
	if c := a.csr.CreationTimestamp.Compare(b.csr.CreationTimestamp.Time); c != 0 {
		return c
	}
	switch {
	case a.csr.Name < b.csr.Name:
		return -1
	case a.csr.Name > b.csr.Name:
		return 1
	}
	return 0
}

// next takes the oldest request of the requester whose turn it is, and
// tells how many of that requester's are queued behind it.
func (q *queue) next() (queued, int, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.turn) > 0 {
		user := q.turn[0]
		q.turn = q.turn[1:]
		list := q.byUser[user]
		if len(list) == 0 {
			delete(q.byUser, user)
			continue
		}
		it, rest := list[0], list[1:]
		if len(rest) == 0 {
			delete(q.byUser, user)
		} else {
			q.byUser[user] = rest
			q.turn = append(q.turn, user)
		}
		return it, len(rest), true
	}
	return queued{}, 0, false
}
