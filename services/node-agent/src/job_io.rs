//! A job's standard streams: pipes (stdout and stderr read apart, stdin only for an
//! interactive job), or the pseudo-terminal of a `--pty` job (`pty.rs`), which is all three
//! and the job's controlling terminal. Either way the job leads a process group of its own,
//! so a kill reaches everything it started; a terminal job leads a session too, as a login
//! shell does, since only a session leader can take a controlling terminal.

use std::io;
use std::process::Stdio;

use mgpu_protocol::job::JobSpec;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::process::{Child, Command};

use crate::pty::{JobTerminal, PtyResizer, take_as_controlling_terminal};

/// What one of the job's output streams is read from.
pub type OutputReader = Box<dyn AsyncRead + Unpin + Send>;
/// What the job's input is written to.
pub type InputWriter = Box<dyn AsyncWrite + Unpin + Send>;

/// How the job's streams are set up, before it starts.
pub enum JobIo {
    Pipes { interactive: bool },
    Terminal(JobTerminal),
}

/// The agent's ends of the job's streams, once it started.
pub struct ConnectedIo {
    pub stdout: OutputReader,
    pub stderr: OutputReader,
    /// None unless the job takes input (interactive, or on a terminal).
    pub stdin: Option<InputWriter>,
    /// The terminal's size control, for a terminal job.
    pub resizer: Option<PtyResizer>,
}

impl JobIo {
    pub fn for_spec(spec: &JobSpec) -> io::Result<JobIo> {
        Ok(match spec.pty {
            Some(size) => JobIo::Terminal(JobTerminal::open(size)?),
            None => JobIo::Pipes {
                interactive: spec.interactive,
            },
        })
    }

    /// Whether the job takes input on `jobs.<id>.input`: a terminal can always be typed into
    /// (`mgpu attach`), pipes only when submitted interactive.
    pub fn takes_input(&self) -> bool {
        match self {
            JobIo::Pipes { interactive } => *interactive,
            JobIo::Terminal(_) => true,
        }
    }

    /// Gives the command its streams, its own process group, and for a terminal job its own
    /// session with the terminal as its controlling terminal.
    pub fn configure(&self, command: &mut Command) -> io::Result<()> {
        match self {
            JobIo::Pipes { interactive } => {
                command
                    .process_group(0)
                    .stdin(if *interactive {
                        Stdio::piped()
                    } else {
                        Stdio::null()
                    })
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped());
            }
            JobIo::Terminal(terminal) => {
                let [stdin, stdout, stderr] = terminal.stdio()?;
                command.stdin(stdin).stdout(stdout).stderr(stderr);
                // A new session is a new process group as well (the child leads both).
                // SAFETY: the closure makes two system calls and allocates nothing.
                unsafe {
                    command.pre_exec(take_as_controlling_terminal);
                }
            }
        }
        Ok(())
    }

    /// The agent's ends, once the child started. A terminal job's output is all on stdout
    /// (the terminal does not tell stdout and stderr apart).
    pub fn connect(self, child: &mut Child) -> io::Result<ConnectedIo> {
        match self {
            JobIo::Pipes { .. } => {
                let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take())
                else {
                    return Err(io::Error::other("the output pipes are missing"));
                };
                Ok(ConnectedIo {
                    stdout: Box::new(stdout),
                    stderr: Box::new(stderr),
                    stdin: child.stdin.take().map(|s| Box::new(s) as InputWriter),
                    resizer: None,
                })
            }
            JobIo::Terminal(terminal) => {
                let (reader, writer, resizer) = terminal.into_controller()?;
                Ok(ConnectedIo {
                    stdout: Box::new(reader),
                    stderr: Box::new(tokio::io::empty()),
                    stdin: Some(Box::new(writer)),
                    resizer: Some(resizer),
                })
            }
        }
    }
}
