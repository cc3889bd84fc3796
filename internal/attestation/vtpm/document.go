// Package vtpm implements attestation with a virtual TPM: a quote of every
// PCR bank by an attestation key (AK), plus the firmware's TCG event log and
// Orrery's userspace measurement log so that a verifier can tell which
// component changed a PCR. It is the common core of the QEMU vTPM variant and
// of future cloud vTPM variants, which differ only in where the AK comes from
// and which CA certifies it.
//
// The issuer talks to a TPM (through go-tpm-tools' client); the validator
// never needs one (it uses go-tpm-tools' quote verification and go-eventlog's
// log parser). They share only the Document wire format.
package vtpm

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// MaxDocumentSize bounds a document received from a peer. Firmware event
// logs of real machines are tens of kilobytes.
const MaxDocumentSize = 4 << 20

// Document is the wire form of a vTPM attestation.
type Document struct {
	// Attestation is a go-tpm-tools attest.Attestation in protobuf wire
	// format: the AK's public area and certificate, one quote per PCR bank
	// (with the PCR values), and the firmware's TCG event log.
	Attestation []byte `json:"attestation"`
	// UserData is the data the quote's nonce binds besides the verifier's
	// nonce (in attested TLS: the attester's TLS public key).
	UserData []byte `json:"userData"`
	// MeasurementLog is Orrery's userspace measurement log (see
	// internal/tpm/pcrlog), as read while the quote was taken.
	MeasurementLog []byte `json:"measurementLog,omitempty"`
}

// Marshal encodes the document.
func (d Document) Marshal() ([]byte, error) { return json.Marshal(d) }

// ParseDocument decodes a document from an untrusted peer.
func ParseDocument(raw []byte) (Document, error) {
	var d Document
	if len(raw) == 0 {
		return d, errors.New("attestation document is empty")
	}
	if len(raw) > MaxDocumentSize {
		return d, fmt.Errorf("attestation document has %d bytes, more than the limit of %d", len(raw), MaxDocumentSize)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		return d, fmt.Errorf("decode attestation document: %w", err)
	}
	if dec.More() {
		return d, errors.New("decode attestation document: trailing data")
	}
	if len(d.Attestation) == 0 {
		return d, errors.New("attestation document has no TPM attestation")
	}
	return d, nil
}
