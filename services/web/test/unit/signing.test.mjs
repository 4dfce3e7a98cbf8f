import { test } from "node:test";
import assert from "node:assert/strict";
import { nkeys } from "@nats-io/nats-core";
import { signatureHeaders, signedBytes, seedFromFile } from "../../src/signing.js";

test("the signature covers subject, time, nonce and payload, as the CLI's", () => {
  const user = nkeys.createUser();
  const payload = new TextEncoder().encode('{"user":"alice"}');
  const headers = Object.fromEntries(
    signatureHeaders(user, "jobs.abc.cancel", payload, 1700000000123, "n1"),
  );
  assert.equal(headers["Mgpu-Signer"], user.getPublicKey());
  assert.equal(headers["Mgpu-Signed-At"], "1700000000123");
  assert.equal(headers["Mgpu-Nonce"], "n1");
  const signature = Uint8Array.from(Buffer.from(headers["Mgpu-Signature"], "hex"));
  const verifier = nkeys.fromPublic(user.getPublicKey());
  const covered = signedBytes("jobs.abc.cancel", 1700000000123, "n1", payload);
  assert.equal(
    new TextDecoder().decode(covered),
    'mgpu-request\njobs.abc.cancel\n1700000000123\nn1\n{"user":"alice"}',
  );
  assert.ok(verifier.verify(covered, signature));
  assert.ok(!verifier.verify(signedBytes("jobs.other.cancel", 1700000000123, "n1", payload), signature));
});

test("a seed file's seed is found, and anything else refused with a reason", () => {
  const seed = new TextDecoder().decode(nkeys.createUser().getSeed());
  assert.equal(seedFromFile(`# alice\n${seed}\n`), seed);
  assert.ok(seedFromFile("not a seed") instanceof Error);
  assert.ok(seedFromFile("") instanceof Error);
});
