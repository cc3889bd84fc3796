#!/usr/bin/env python3
"""Known answers for package keys, computed without any Go code.

HKDF-SHA256 (RFC 5869) is implemented here from hmac and hashlib alone, so
a mistake in the Go derivations cannot also hide in the expected values.
The info strings are spelled out again on purpose: if someone changes them
in Go, the known-answer test must fail.

Run: python3 internal/keys/testdata/kat.py
and paste the printed constants into kat_test.go.
"""

import hashlib
import hmac


def hkdf_sha256(secret: bytes, salt: bytes, info: bytes, length: int) -> bytes:
    # Extract. An empty salt means HashLen zero bytes (RFC 5869, 2.2).
    prk = hmac.new(salt or bytes(32), secret, hashlib.sha256).digest()
    # Expand.
    out, block, counter = b"", b"", 1
    while len(out) < length:
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        out += block
        counter += 1
    return out[:length]


def self_check() -> None:
    # RFC 5869, test case 1, so this script cannot drift from the RFC either.
    okm = hkdf_sha256(
        bytes.fromhex("0b" * 22),
        bytes.fromhex("000102030405060708090a0b0c"),
        bytes.fromhex("f0f1f2f3f4f5f6f7f8f9"),
        42,
    )
    want = (
        "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf"
        "34007208d5b887185865"
    )
    assert okm.hex() == want, okm.hex()


MASTER_KEY = bytes(range(0x00, 0x20))
MASTER_SALT = bytes(range(0x20, 0x40))
MEASUREMENT_SALT = bytes(range(0x40, 0x60))
DATA_KEY_ID = "kat-key"
DISK_UUID = "0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f"


def data_key(key_id: str, length: int) -> bytes:
    info = ("orrery/v1/data-key/" + key_id).encode()
    return hkdf_sha256(MASTER_KEY, MASTER_SALT, info, length)


def ed25519_public(seed: bytes) -> bytes:
    # RFC 8032 key generation is long to write by hand; the pyca
    # implementation is independent of Go's, which is what counts here.
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.from_private_bytes(seed).public_key()
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def main() -> None:
    self_check()
    measurement_secret = hkdf_sha256(
        MASTER_KEY, MASTER_SALT, b"orrery/v1/measurement-secret", 32
    )
    cluster_id = hkdf_sha256(
        measurement_secret, MEASUREMENT_SALT, b"orrery/v1/cluster-id", 32
    )
    owner_seed = hkdf_sha256(
        MASTER_KEY, MASTER_SALT, b"orrery/v1/owner-access-key", 32
    )
    values = [
        ("katDataKey16", data_key(DATA_KEY_ID, 16)),
        ("katDataKey64", data_key(DATA_KEY_ID, 64)),
        ("katDiskKey", data_key("disk:" + DISK_UUID, 32)),
        ("katMeasurementSecret", measurement_secret),
        ("katClusterID", cluster_id),
        ("katOwnerAccessKey", ed25519_public(owner_seed)),
    ]
    for name, value in values:
        print(f'{name} = "{value.hex()}"')


if __name__ == "__main__":
    main()
