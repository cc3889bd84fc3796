// Package tdx verifies Intel TDX evidence in the form Google Cloud's
// Confidential VMs produce it: go-tpm-tools' attest.Attestation (what
// `gotpm attest --tee-technology tdx` and client.AttestOpts{TEENonce}
// make) carries a vTPM quote and, as TdxAttestation, a TD quote (format
// v4, go-tdx-guest's QuoteV4) whose REPORT_DATA is the 64-byte TEENonce.
// Orrery's nodes use tee.ReportData(nonce, userData) as that nonce, so
// the TD quote binds the same session as the vTPM quote. This package
// checks the TD quote only; package vtpm checks the vTPM quote.
//
// # What is verified, and by whom
//
// The cryptography is go-tdx-guest's; nothing here parses a quote or a
// certificate by hand. Its verify package checks, against the owner's
// collateral: the quote's signature by the quoting enclave's (QE)
// attestation key; the QE report, signed by the platform's PCK key,
// binding that attestation key; the PCK certificate chain up to Intel's
// SGX Root CA (or Config.TrustedRoots); the PCK CRL and the root CA CRL
// (unless Config.SkipRevocationCheck); the TCB info and QE identity,
// signed under the same root and not past their nextUpdate; that the
// TDX module is Intel's (MRSIGNERSEAM, SEAM attributes) and so is the QE
// (its signer, product ID and attributes, by the QE identity); and that
// the platform's TDX TCB and the QE's TCB are UpToDate by that TCB info
// and QE identity. Any other status (OutOfDate, SWHardeningNeeded,
// ConfigurationNeeded, no matching level) is refused: go-tdx-guest
// offers no way to accept one.
//
// A verifier without a cache (Config.SkipCollateral: a node checking its
// join service) has go-tdx-guest check the signatures and the PCK chain
// only, and checks itself that the QE and the TDX module are Intel's, by
// the identities Intel's QE identity and TCB info state for them, which
// do not change (intel.go). It checks neither revocation nor TCB status.
//
// go-tdx-guest's validate package then checks the quote's fields: XFAM
// and TD attributes free of the bits it allows no TD, REPORT_DATA equal
// to the session's (a mismatch means the quote was replayed or relayed),
// and each field of the owner's Policy, one at a time so that each can
// be enforced or warn-only on its own. A debug TD is refused whatever
// the policy says.
//
// # Collateral cache
//
// Verification never uses the network. go-tdx-guest asks for Intel PCS
// URLs; a Collateral answers from files the owner fetched beforehand
// (CollateralDir reads a directory, CollateralMap holds the same files
// in memory). The layout, with the URL each file comes from:
//
//	tcb-info-<fmspc>.json                  body of https://api.trustedservices.intel.com/tdx/certification/v4/tcb?fmspc=<fmspc>
//	tcb-info-<fmspc>.issuer-chain.pem      that response's TCB-Info-Issuer-Chain header
//	qe-identity.json                       body of https://api.trustedservices.intel.com/tdx/certification/v4/qe/identity
//	qe-identity.issuer-chain.pem           that response's SGX-Enclave-Identity-Issuer-Chain header
//	pck-crl-<ca>.der                       body of https://api.trustedservices.intel.com/sgx/certification/v4/pckcrl?ca=<ca>&encoding=der
//	pck-crl-<ca>.issuer-chain.pem          that response's SGX-PCK-CRL-Issuer-Chain header
//	root-ca-crl.der                        body of https://certificates.trustedservices.intel.com/IntelSGXRootCA.der
//	gce-tdx-endorsement-<mrtd>.binarypb    body of https://storage.googleapis.com/gce_tcb_integrity/ovmf_x64_csm/tdx/<mrtd>.binarypb
//	                                       (Google's launch endorsement; only for a policy with gceLaunchEndorsement)
//
// <fmspc> is the platform's FMSPC in lowercase hex (12 digits, from its
// PCK certificate: an error naming the missing file says which), <ca> is
// "platform" or "processor" (the CA that issued the PCK certificate).
// Issuer chains are saved as PEM: the header's value URL-decoded (the
// signing certificate, then Intel's root). TCB info, QE identity and the
// PCK CRL are reissued about monthly and expire at their nextUpdate;
// the root CA CRL yearly. An expired file is refused, as is a file
// missing from the cache; both errors say what to fetch.
//
// # What a TD quote proves, and what it does not
//
// A verified quote proves that a genuine Intel TDX platform, at a TCB
// level Intel calls up to date, runs a TD whose initial memory (MRTD:
// the firmware the host loaded) and runtime measurement registers
// (RTMR0-3, extended by that firmware and the boot chain) are those
// shown, under a TDX module whose measurement is MRSEAM, and that this
// TD asked for the quote for this session. It says nothing about the
// vTPM: on Google Cloud the vTPM is Google's, emulated outside the TD,
// so the PCRs checked by package vtpm rest on trusting the cloud, not
// on the CPU. It says nothing either about the host's software outside
// the TDX module, about availability, or about side channels.
package tdx
