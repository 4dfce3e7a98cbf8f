// Signing in: the user's nkey seed (from a file they choose, kept in this tab's session
// storage only, never sent anywhere: the server sees a signature of its nonce) and the NATS
// WebSocket listener's address. Connects, reconnects by itself, and turns the client's errors
// into sentences.

import { wsconnect, nkeyAuthenticator, nkeys } from "@nats-io/nats-core";
import { jetstream } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { seedFromFile } from "./signing.js";

const SEED_KEY = "mgpu.seed";
const encoder = new TextEncoder();

/** The seed this tab signed in with, if any. */
export function storedSeed() {
  return sessionStorage.getItem(SEED_KEY);
}

export function forgetSeed() {
  sessionStorage.removeItem(SEED_KEY);
}

/** Reads a chosen seed file: the seed, or an Error saying why not. */
export async function readSeedFile(file) {
  if (!file) return new Error("choose your nkey seed file first");
  if (file.size > 64 * 1024) return new Error("this file is too large to be an nkey seed file");
  return seedFromFile(await file.text());
}

/** The key pair of a seed, or an Error (a seed that is not one, a key that is not a user's). */
export function keyPairOf(seed) {
  try {
    const keyPair = nkeys.fromSeed(encoder.encode(seed));
    if (!keyPair.getPublicKey().startsWith("U")) {
      return new Error("this seed is not a user's key (a user's public key starts with U)");
    }
    return keyPair;
  } catch (error) {
    return new Error(`this is not a valid nkey seed (${error.message})`);
  }
}

/**
 * Connects to `url` as the holder of `seed`. Resolves to {nc, js, kvm, keyPair, publicKey};
 * rejects with an Error whose message a person can act on. `onStatus(text, kind)` hears about
 * disconnects and reconnects afterwards.
 */
export async function connect(url, seed, onStatus) {
  const keyPair = keyPairOf(seed);
  if (keyPair instanceof Error) throw keyPair;
  // Derived once: each derivation from the seed costs milliseconds (an ed25519 key pair), and
  // the views compare it with every record they draw.
  const publicKey = keyPair.getPublicKey();
  let nc;
  try {
    nc = await wsconnect({
      servers: url,
      name: "mgpu web",
      authenticator: nkeyAuthenticator(encoder.encode(seed)),
      // Users may only receive on inboxes under their own key.
      inboxPrefix: `_INBOX.${publicKey}`,
      maxReconnectAttempts: -1,
      reconnectTimeWait: 1000,
      waitOnFirstConnect: false,
      timeout: 5000,
    });
  } catch (error) {
    throw new Error(explainConnectError(error, url));
  }
  sessionStorage.setItem(SEED_KEY, seed);
  watchStatus(nc, onStatus);
  return { nc, js: jetstream(nc), kvm: new Kvm(nc), keyPair, publicKey };
}

async function watchStatus(nc, onStatus) {
  for await (const status of nc.status()) {
    switch (status.type) {
      case "disconnect":
        onStatus("disconnected from the server: reconnecting…", "bad");
        break;
      case "reconnecting":
        onStatus("reconnecting…", "bad");
        break;
      case "reconnect":
        onStatus("connected again", "good");
        break;
      case "error": {
        const text = String(status.error?.message || status.error);
        // A refused request is reported by the operation that made it (a viewer's usage
        // view asks for history it may not read, say); the connection itself is fine.
        if (!/permissions violation/i.test(text)) onStatus(`server error: ${text}`, "bad");
        break;
      }
      default:
        break;
    }
  }
}

/** A connection error in words. */
export function explainConnectError(error, url) {
  const text = String((error && error.message) || error);
  if (/authoriz|authentic/i.test(text)) {
    return "the server refused this key: it is not a user of this cluster (ask an admin for `mgpu admin add-user`)";
  }
  if (/websocket|refused|failed|timeout|connect/i.test(text)) {
    return `cannot reach the NATS WebSocket listener at ${url} (${text}); is the server up, and does its configuration have a websocket block? (mgpu admin init writes one, on port 4280)`;
  }
  return `cannot connect to ${url}: ${text}`;
}
