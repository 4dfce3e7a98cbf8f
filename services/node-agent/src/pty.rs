//! The pseudo-terminal of a `--pty` job: made before the job starts, its terminal side becomes
//! the job's standard streams and controlling terminal, and the agent keeps the other side,
//! reading what the job shows (raw bytes, colours and cursor moves included) and writing what
//! the viewer types. A resize changes the terminal's size, and the kernel tells the job
//! (SIGWINCH) as any terminal would.
//!
//! Both sides are opened close-on-exec in one step: the agent starts jobs from several
//! threads, and another job inheriting this terminal would keep it open after this job ended.

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::process::Stdio;
use std::task::{Context, Poll, ready};

use mgpu_protocol::terminal::TermSize;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A job's terminal before the job starts: both sides.
pub struct JobTerminal {
    /// The agent's side, non-blocking.
    controller: OwnedFd,
    /// The job's side; given to the job as its standard streams and dropped here after the
    /// start, so that the controller reads end of file once the job's processes are gone.
    terminal: OwnedFd,
}

impl JobTerminal {
    /// Opens a pseudo-terminal of `size`.
    pub fn open(size: TermSize) -> io::Result<JobTerminal> {
        // SAFETY: posix_openpt returns a new descriptor or -1.
        let controller = check(unsafe {
            libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC | libc::O_NONBLOCK)
        })?;
        // SAFETY: the descriptor was just created and is owned by nothing else.
        let controller = unsafe { OwnedFd::from_raw_fd(controller) };
        let raw = controller.as_raw_fd();
        // SAFETY: both take a descriptor of a pseudo-terminal's controlling side.
        check(unsafe { libc::grantpt(raw) })?;
        check(unsafe { libc::unlockpt(raw) })?;
        // TIOCGPTPEER opens the terminal side from the controller itself (Linux 4.13+),
        // with no path to look up and no race with anyone opening that path.
        let flags = libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC;
        // SAFETY: TIOCGPTPEER takes the open flags and returns a new descriptor or -1.
        let terminal = check(unsafe { libc::ioctl(raw, libc::TIOCGPTPEER, flags) })?;
        // SAFETY: as above.
        let terminal = unsafe { OwnedFd::from_raw_fd(terminal) };
        resize(&controller, size)?;
        Ok(JobTerminal {
            controller,
            terminal,
        })
    }

    /// The job's standard input, output and error: the terminal side, three times.
    pub fn stdio(&self) -> io::Result<[Stdio; 3]> {
        let copy = || self.terminal.try_clone().map(Stdio::from);
        Ok([copy()?, copy()?, copy()?])
    }

    /// After the job started: the agent's reading and writing ends (two descriptors of the
    /// controlling side, so a pending read never holds up a write) and a handle to resize.
    /// The terminal side is closed here.
    pub fn into_controller(self) -> io::Result<(PtyReader, PtyWriter, PtyResizer)> {
        let JobTerminal {
            controller,
            terminal,
        } = self;
        drop(terminal);
        let writer = controller.try_clone()?;
        let resizer = controller.try_clone()?;
        Ok((
            PtyReader(register(controller)?),
            PtyWriter(register(writer)?),
            PtyResizer(resizer),
        ))
    }
}

/// Watches an owned descriptor with the runtime's reactor.
fn register(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an OwnedFd is a valid descriptor, open until the AsyncFd drops it, and always
    // gives the same number.
    unsafe { AsyncFd::register(fd) }.map_err(|err| err.into_parts().1)
}

/// Makes the calling process a session leader with the terminal on its standard input as its
/// controlling terminal. Runs in the child between fork and exec: system calls only.
pub fn take_as_controlling_terminal() -> io::Result<()> {
    // SAFETY: setsid and ioctl take no pointers here.
    check(unsafe { libc::setsid() })?;
    check(unsafe { libc::ioctl(0, libc::TIOCSCTTY, 0) })?;
    Ok(())
}

/// Changes a job's terminal size.
pub struct PtyResizer(OwnedFd);

impl PtyResizer {
    pub fn resize(&self, size: TermSize) -> io::Result<()> {
        resize(&self.0, size)
    }
}

fn resize(fd: &impl AsFd, size: TermSize) -> io::Result<()> {
    let window = libc::winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize from a live value.
    check(unsafe { libc::ioctl(fd.as_fd().as_raw_fd(), libc::TIOCSWINSZ, &window) })?;
    Ok(())
}

fn check(result: RawFd) -> io::Result<RawFd> {
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(result)
    }
}

/// What the job shows. Linux answers a read with EIO once every process has closed the
/// terminal side, after what they wrote has been read: that is this reader's end of file.
pub struct PtyReader(AsyncFd<OwnedFd>);

impl AsyncRead for PtyReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.0.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            let fd = guard.get_inner().as_raw_fd();
            // SAFETY: the kernel writes at most `unfilled.len()` bytes into a live slice.
            let result = unsafe { libc::read(fd, unfilled.as_mut_ptr().cast(), unfilled.len()) };
            match result {
                n if n >= 0 => {
                    buf.advance(n as usize);
                    return Poll::Ready(Ok(()));
                }
                _ => match io::Error::last_os_error() {
                    err if err.kind() == io::ErrorKind::WouldBlock => guard.clear_ready(),
                    err if err.raw_os_error() == Some(libc::EIO) => return Poll::Ready(Ok(())),
                    err if err.kind() == io::ErrorKind::Interrupted => {}
                    err => return Poll::Ready(Err(err)),
                },
            }
        }
    }
}

/// What the viewer types, written to the job's terminal.
pub struct PtyWriter(AsyncFd<OwnedFd>);

impl AsyncWrite for PtyWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.0.poll_write_ready(cx))?;
            let fd = guard.get_inner().as_raw_fd();
            // SAFETY: the kernel reads at most `data.len()` bytes from a live slice.
            let result = unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) };
            match result {
                n if n >= 0 => return Poll::Ready(Ok(n as usize)),
                _ => match io::Error::last_os_error() {
                    err if err.kind() == io::ErrorKind::WouldBlock => guard.clear_ready(),
                    err if err.kind() == io::ErrorKind::Interrupted => {}
                    err => return Poll::Ready(Err(err)),
                },
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A real terminal: the child sees one of the asked size, echoes what is typed, and the
    /// reader ends when the child is gone.
    #[tokio::test]
    async fn a_child_runs_on_the_terminal_and_the_reader_sees_it_end() {
        let terminal = JobTerminal::open(TermSize { cols: 91, rows: 17 })
            .unwrap_or_else(|e| panic!("cannot open a pseudo-terminal: {e}"));
        let [stdin, stdout, stderr] = terminal.stdio().unwrap_or_else(|e| panic!("{e}"));
        let mut command = tokio::process::Command::new("/bin/sh");
        command
            .args([
                "-c",
                "test -t 1 && echo tty; stty size; read line; echo got:$line",
            ])
            .stdin(stdin)
            .stdout(stdout)
            .stderr(stderr);
        // SAFETY: the closure makes two system calls.
        unsafe {
            command.pre_exec(take_as_controlling_terminal);
        }
        let mut child = command.spawn().unwrap_or_else(|e| panic!("{e}"));
        drop(command);
        let (mut reader, mut writer, _resizer) =
            terminal.into_controller().unwrap_or_else(|e| panic!("{e}"));
        writer
            .write_all(b"hello\n")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut seen = Vec::new();
        let read = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            reader.read_to_end(&mut seen),
        )
        .await;
        assert!(matches!(read, Ok(Ok(_))), "{read:?}");
        let seen = String::from_utf8_lossy(&seen);
        assert!(seen.contains("tty"), "{seen}");
        assert!(seen.contains("17 91"), "{seen}");
        assert!(seen.contains("got:hello"), "{seen}");
        let status = child.wait().await.unwrap_or_else(|e| panic!("{e}"));
        assert!(status.success());
    }
}
