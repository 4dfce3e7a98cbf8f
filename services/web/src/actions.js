// Cancel, hold and release from the page: the same JSON payloads the CLI sends, signed in the
// browser with the user's key (signing.js) and stored in the requests stream through
// JetStream, with a fresh Nats-Msg-Id so a retried click is stored once.

import { headers as natsHeaders } from "@nats-io/nats-core";
import { signatureHeaders, freshNonce } from "./signing.js";

const encoder = new TextEncoder();

/** The request subject of `action` (cancel, hold, release) for job `id`. */
export function actionSubject(id, action) {
  if (!["cancel", "hold", "release"].includes(action)) {
    throw new Error(`unknown action ${action}`);
  }
  return `jobs.${id}.${action}`;
}

/**
 * Publishes `action` on job `id` as `user` (the name the request names; the scheduler acts on
 * the signer). Resolves once JetStream stored it; rejects with a sentence.
 */
export async function requestAction(conn, id, action, user) {
  const subject = actionSubject(id, action);
  const body = action === "cancel" ? { user, reason: "cancelled from the web page" } : { user };
  const payload = encoder.encode(JSON.stringify(body));
  const h = natsHeaders();
  for (const [name, value] of signatureHeaders(conn.keyPair, subject, payload, Date.now())) {
    h.set(name, value);
  }
  try {
    await conn.js.publish(subject, payload, { headers: h, msgID: freshNonce() });
  } catch (error) {
    const text = String(error.message || error);
    if (/permission/i.test(text)) {
      throw new Error(`the server refused the ${action}, this key may not send requests (${text})`);
    }
    throw new Error(`the ${action} was not stored: ${text}`);
  }
}
