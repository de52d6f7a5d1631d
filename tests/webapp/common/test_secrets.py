from webapp.common.secrets import secret_digest, secret_hash, secret_matches, secret_new


def test_a_secret_matches_its_salted_hash_only():
    key = secret_new("edk")
    stored = secret_hash(key)
    assert key.startswith("edk_") and len(key) > 40
    assert key not in stored
    assert secret_matches(key, stored)
    assert not secret_matches(key + "x", stored)
    assert not secret_matches(key, "")


def test_hashes_are_salted_but_digests_are_not():
    assert secret_hash("same") != secret_hash("same")
    assert secret_digest("same") == secret_digest("same")
    assert secret_new("ept") != secret_new("ept")
