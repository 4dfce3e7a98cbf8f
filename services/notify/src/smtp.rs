//! Sending one mail through the site's relay (`[notify] smtp`): plain SMTP (RFC 5321) over
//! TCP, EHLO, one sender, one recipient, the message, QUIT. No TLS or authentication: the
//! relay a cluster's hosts use is normally on the site's network and takes their mail as is.

use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::TcpStream;

use crate::deliver_error::DeliveryError;

/// One mail.
pub struct Mail<'a> {
    pub from: &'a str,
    pub to: &'a str,
    pub subject: &'a str,
    pub body: &'a str,
    /// Unique per notice and destination, for the `Message-ID` header.
    pub id: &'a str,
}

/// Sends `mail` through `relay` (`host`, `port`); Ok once the relay accepted it.
pub async fn send(
    relay: &(String, u16),
    mail: &Mail<'_>,
    timeout: Duration,
) -> Result<(), DeliveryError> {
    tokio::time::timeout(timeout, converse(relay, mail))
        .await
        .map_err(|_| {
            DeliveryError::retry(format!("the relay {} did not answer in time", relay.0))
        })?
}

async fn converse(relay: &(String, u16), mail: &Mail<'_>) -> Result<(), DeliveryError> {
    let stream = TcpStream::connect((relay.0.as_str(), relay.1))
        .await
        .map_err(|e| DeliveryError::retry(format!("connecting to the relay {}: {e}", relay.0)))?;
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    expect(&mut read, "greeting", &[220]).await?;
    let steps: [(String, &str, &[u16]); 4] = [
        ("EHLO mgpu-notify\r\n".to_owned(), "EHLO", &[250]),
        (
            format!("MAIL FROM:<{}>\r\n", mail.from),
            "MAIL FROM",
            &[250],
        ),
        (format!("RCPT TO:<{}>\r\n", mail.to), "RCPT TO", &[250, 251]),
        ("DATA\r\n".to_owned(), "DATA", &[354]),
    ];
    for (command, what, codes) in steps {
        send_line(&mut write, command.as_bytes()).await?;
        expect(&mut read, what, codes).await?;
    }
    send_line(&mut write, &message(mail)).await?;
    expect(&mut read, "the message", &[250]).await?;
    // The mail is accepted; how the relay says goodbye does not matter.
    let _ = write.write_all(b"QUIT\r\n").await;
    Ok(())
}

async fn send_line(
    write: &mut tokio::net::tcp::OwnedWriteHalf,
    bytes: &[u8],
) -> Result<(), DeliveryError> {
    write
        .write_all(bytes)
        .await
        .map_err(|e| DeliveryError::retry(format!("writing to the relay: {e}")))
}

/// Reads one reply (its continuation lines `NNN-…` too) and checks its code.
async fn expect(
    read: &mut BufReader<tokio::net::tcp::OwnedReadHalf>,
    what: &str,
    codes: &[u16],
) -> Result<(), DeliveryError> {
    let mut line = String::new();
    loop {
        line.clear();
        let n = read
            .read_line(&mut line)
            .await
            .map_err(|e| DeliveryError::retry(format!("reading from the relay: {e}")))?;
        if n == 0 {
            return Err(DeliveryError::retry(format!("the relay hung up at {what}")));
        }
        // `250-PIPELINING` continues; `250 OK` ends the reply.
        if line.as_bytes().get(3) != Some(&b'-') {
            break;
        }
    }
    let code: u16 = line.get(..3).and_then(|c| c.parse().ok()).unwrap_or(0);
    if codes.contains(&code) {
        return Ok(());
    }
    let text = format!("the relay refused {what}: {}", line.trim_end());
    // 5xx is the relay's final word; anything else may pass later.
    if (500..600).contains(&code) {
        Err(DeliveryError::permanent(text))
    } else {
        Err(DeliveryError::retry(text))
    }
}

/// The message with its headers, lines ended by CRLF, dot-stuffed, and the final `.` line.
fn message(mail: &Mail<'_>) -> Vec<u8> {
    // A header is one line: a notice's text never breaks out of the subject.
    let subject: String = mail
        .subject
        .chars()
        .map(|c| {
            if c.is_control() || !c.is_ascii() {
                ' '
            } else {
                c
            }
        })
        .collect();
    let mut text = format!(
        "From: mgpu <{from}>\r\nTo: <{to}>\r\nSubject: {subject}\r\nDate: {date}\r\n\
         Message-ID: <{id}@mgpu-notify>\r\nMIME-Version: 1.0\r\n\
         Content-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: 8bit\r\n\r\n",
        from = mail.from,
        to = mail.to,
        date = chrono::Utc::now().to_rfc2822(),
        id = mail.id,
    );
    for line in mail.body.lines() {
        if line.starts_with('.') {
            text.push('.');
        }
        text.push_str(line);
        text.push_str("\r\n");
    }
    text.push_str(".\r\n");
    text.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_is_dot_stuffed_and_its_subject_one_line() {
        let mail = Mail {
            from: "mgpu@lab.example",
            to: "alice@lab.example",
            subject: "job ended\r\nBcc: eve@evil.example",
            body: "line one\n.hidden\nlast",
            id: "n1",
        };
        let text = String::from_utf8(message(&mail)).unwrap_or_default();
        assert!(text.contains("Subject: job ended  Bcc: eve@evil.example\r\n"));
        assert!(!text.contains("\r\nBcc:"));
        assert!(text.contains("\r\n..hidden\r\n"));
        assert!(text.ends_with("last\r\n.\r\n"));
    }
}
