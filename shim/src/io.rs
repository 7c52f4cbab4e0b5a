//! A process's stdio: containerd's fifos on one side, the container's pipes or pty on
//! the other, and copy tasks in between.
//!
//! Pipes (not the fifos themselves) go to the container so that closing stdin
//! (`CloseIO`) and the end of output are under the shim's control, as in runc's shim.
//! Output fifos are opened read-write, which never blocks and never fails with EPIPE
//! while containerd is restarting; they are closed as soon as the container's side
//! reaches EOF, which is how the client learns the output is complete.

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::Arc;
use std::time::Duration;

use crab_runtime::helper::ChildStdio;
use nix::fcntl::OFlag;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

use crate::error::{ShimError, ShimResult};
use crate::log_uri::{Logger, Output};

/// The fifo paths containerd gave for a process.
#[derive(Debug, Clone, Default)]
pub struct StdioPaths {
    /// Input fifo ("" for none).
    pub stdin: String,
    /// Output fifo ("" for none).
    pub stdout: String,
    /// Error fifo ("" for none).
    pub stderr: String,
    /// Whether the process has a terminal (then stdout carries both outputs).
    pub terminal: bool,
    /// The container's namespace and id, for a logging binary's environment.
    pub container: (String, String),
}

type StdinWriter = Arc<Mutex<Option<Box<dyn AsyncWrite + Send + Unpin>>>>;

/// The shim's side of a running process's stdio.
pub struct ProcessIo {
    stdin: StdinWriter,
    stdin_path: String,
    stdin_task: Option<JoinHandle<()>>,
    outputs: Vec<JoinHandle<()>>,
    console: Option<Arc<OwnedFd>>,
    logger: Option<Logger>,
}

impl std::fmt::Debug for ProcessIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessIo")
            .field("outputs", &self.outputs.len())
            .field("terminal", &self.console.is_some())
            .finish()
    }
}

/// Pipes made before the process exists; [`PipeIo::start`] begins copying.
pub struct PipeIo {
    paths: StdioPaths,
    stdin_w: Option<OwnedFd>,
    stdout_r: Option<OwnedFd>,
    stderr_r: Option<OwnedFd>,
}

fn pipe() -> ShimResult<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| ShimError::Other(format!("pipe: {e}")))
}

impl PipeIo {
    /// Makes the pipes; returns them and the container's ends for the helper.
    pub fn new(paths: &StdioPaths) -> ShimResult<(PipeIo, ChildStdio)> {
        let mut child = ChildStdio::default();
        let mut io = PipeIo {
            paths: paths.clone(),
            stdin_w: None,
            stdout_r: None,
            stderr_r: None,
        };
        // Always pipes, even where containerd gave no fifo: CRIU can hand a pipe to a
        // restored process (by its key), but not a file of the shim's mount namespace.
        let (r, w) = pipe()?;
        child.stdin = Some(r);
        // No stdin fifo: the write end closes here, and the process reads EOF.
        io.stdin_w = (!paths.stdin.is_empty()).then_some(w);
        let (r, w) = pipe()?;
        child.stdout = Some(w);
        io.stdout_r = Some(r);
        let (r, w) = pipe()?;
        child.stderr = Some(w);
        io.stderr_r = Some(r);
        Ok((io, child))
    }

    /// Pipes for a process whose fifos are not known yet (a replica for forks):
    /// the write end of its stdin is kept until [`PipeIo::bind`] names them.
    pub fn unbound() -> ShimResult<(PipeIo, ChildStdio)> {
        let kept = StdioPaths {
            stdin: "(not yet known)".into(),
            ..Default::default()
        };
        let (mut io, child) = PipeIo::new(&kept)?;
        io.paths = StdioPaths::default();
        Ok((io, child))
    }

    /// Names the fifos of [`PipeIo::unbound`] pipes; without a stdin fifo, the
    /// process reads EOF on its stdin from now on, as if made for none.
    pub fn bind(mut self, paths: &StdioPaths) -> PipeIo {
        if paths.stdin.is_empty() {
            self.stdin_w = None;
        }
        self.paths = paths.clone();
        self
    }

    /// Starts the copy tasks.
    pub fn start(self) -> ShimResult<ProcessIo> {
        let ([out, err], logger) = open_outputs(&self.paths, false)?;
        let mut outputs = Vec::new();
        for (r, dst) in [(self.stdout_r, out), (self.stderr_r, err)] {
            if let Some(r) = r {
                let src = pipe::Receiver::from_owned_fd(r)
                    .map_err(|e| ShimError::Other(format!("stdio pipe: {e}")))?;
                outputs.push(tokio::spawn(copy_output(src, dst)));
            }
        }
        let stdin: StdinWriter = Arc::new(Mutex::new(None));
        let mut stdin_task = None;
        if let Some(w) = self.stdin_w {
            let w = pipe::Sender::from_owned_fd(w)
                .map_err(|e| ShimError::Other(format!("stdin pipe: {e}")))?;
            *stdin.try_lock().expect("new mutex") = Some(Box::new(w));
            stdin_task = Some(tokio::spawn(copy_input(
                self.paths.stdin.clone(),
                stdin.clone(),
            )));
        }
        Ok(ProcessIo {
            stdin,
            stdin_path: self.paths.stdin.clone(),
            stdin_task,
            outputs,
            console: None,
            logger,
        })
    }
}

impl ProcessIo {
    /// Copies between the fifos and a pty master.
    pub fn terminal(paths: &StdioPaths, master: OwnedFd) -> ShimResult<ProcessIo> {
        let dup = |fd: &OwnedFd| {
            fd.try_clone()
                .map_err(|e| ShimError::Other(format!("dup pty master: {e}")))
        };
        // Without an output fifo (a restored terminal task of crabctl's) the output is
        // read and dropped: a full pty would block the process.
        let src = tokio::fs::File::from_std(File::from(dup(&master)?));
        let ([dst, _], logger) = open_outputs(paths, true)?;
        let outputs = vec![tokio::spawn(copy_output(src, dst))];
        let stdin: StdinWriter = Arc::new(Mutex::new(None));
        let mut stdin_task = None;
        if !paths.stdin.is_empty() {
            let w = tokio::fs::File::from_std(File::from(dup(&master)?));
            *stdin.try_lock().expect("new mutex") = Some(Box::new(w));
            stdin_task = Some(tokio::spawn(copy_input(paths.stdin.clone(), stdin.clone())));
        }
        Ok(ProcessIo {
            stdin,
            stdin_path: paths.stdin.clone(),
            stdin_task,
            outputs,
            console: Some(Arc::new(master)),
            logger,
        })
    }

    /// A process with no stdio at all.
    pub fn none() -> ProcessIo {
        ProcessIo {
            stdin: Arc::new(Mutex::new(None)),
            stdin_path: String::new(),
            stdin_task: None,
            outputs: Vec::new(),
            console: None,
            logger: None,
        }
    }

    /// The pty master, for resizing.
    pub fn console(&self) -> Option<&OwnedFd> {
        self.console.as_deref()
    }

    /// Closes the process's stdin (containerd's `CloseIO`).
    pub async fn close_stdin(&self) {
        self.stdin.lock().await.take();
    }

    /// Waits (up to `timeout`) for all output to reach containerd, then stops copying.
    pub async fn finish(&mut self, timeout: Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        for task in self.outputs.drain(..) {
            let abort = task.abort_handle();
            if tokio::time::timeout_at(deadline, task).await.is_err() {
                abort.abort();
            }
        }
        self.stop_stdin();
        self.stdin.lock().await.take();
        if let Some(logger) = self.logger.take() {
            tokio::task::spawn_blocking(move || logger.finish());
        }
    }

    /// Stops the stdin copy. A copy still blocked in opening the fifo (the client never
    /// opened its end) sits on a blocking thread that abort cannot reach, and would keep
    /// the shim from exiting: opening the fifo's write end releases it.
    fn stop_stdin(&mut self) {
        if let Some(t) = self.stdin_task.take() {
            t.abort();
            if !self.stdin_path.is_empty() {
                let _ = std::fs::OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(&self.stdin_path);
            }
        }
    }
}

impl Drop for ProcessIo {
    fn drop(&mut self) {
        for t in &self.outputs {
            t.abort();
        }
        self.stop_stdin();
        if let Some(logger) = self.logger.take() {
            std::thread::spawn(move || logger.finish());
        }
    }
}

/// A destination of output.
enum Sink {
    /// containerd's fifo.
    Fifo(pipe::Sender),
    /// A log file (`file://`).
    File(tokio::fs::File),
    /// A logging binary's fd 3 or 4 (`binary://`).
    Logger(pipe::Sender),
}

impl Sink {
    async fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            Sink::Fifo(s) | Sink::Logger(s) => s.write_all(bytes).await,
            // tokio's File buffers a write until flushed.
            Sink::File(f) => {
                f.write_all(bytes).await?;
                f.flush().await
            }
        }
    }

    /// Waits until the client read everything (a fifo's; others need not wait).
    async fn drained(&self) {
        if let Sink::Fifo(d) = self {
            while unread(d) > 0 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    }
}

/// The destinations of stdout and stderr, and the logging binary when the stdout URI
/// names one (then, as for a file, both outputs go there). `terminal`: one output.
fn open_outputs(
    paths: &StdioPaths,
    terminal: bool,
) -> ShimResult<([Option<Sink>; 2], Option<Logger>)> {
    let fifo = |path: &str| -> ShimResult<Option<Sink>> {
        match Output::parse(path)? {
            Output::None => Ok(None),
            Output::Fifo(p) => Ok(Some(Sink::Fifo(open_output_fifo(&p)?))),
            _ => Err(ShimError::InvalidArgument(format!(
                "stderr {path:?}: a log URI is given as stdout"
            ))),
        }
    };
    match Output::parse(&paths.stdout)? {
        Output::File(path) => {
            let file = crate::log_uri::open_file(&path)?;
            let second = file
                .try_clone()
                .map_err(|e| ShimError::Other(format!("log file {}: {e}", path.display())))?;
            let both = [file, second].map(|f| Some(Sink::File(tokio::fs::File::from_std(f))));
            Ok((both, None))
        }
        Output::Binary { path, args } => {
            let (namespace, id) = &paths.container;
            // The wait for its readiness (up to seconds) must not hold a runtime
            // worker that other containers' requests need.
            let start = || Logger::start(&path, &args, namespace, id);
            let multi_thread = tokio::runtime::Handle::try_current()
                .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
            let (logger, out, err) = if multi_thread {
                tokio::task::block_in_place(start)?
            } else {
                start()?
            };
            let sink = |fd: OwnedFd| -> ShimResult<Option<Sink>> {
                let s = pipe::Sender::from_owned_fd(fd)
                    .map_err(|e| ShimError::Other(format!("logging pipe: {e}")))?;
                Ok(Some(Sink::Logger(s)))
            };
            let err = if terminal { None } else { sink(err)? };
            Ok(([sink(out)?, err], Some(logger)))
        }
        Output::None | Output::Fifo(_) => {
            let err = if terminal { None } else { fifo(&paths.stderr)? };
            Ok(([fifo(&paths.stdout)?, err], None))
        }
    }
}

fn open_output_fifo(path: &str) -> ShimResult<pipe::Sender> {
    pipe::OpenOptions::new()
        .read_write(true)
        .open_sender(path)
        .map_err(|e| ShimError::Other(format!("open output fifo {path}: {e}")))
}

/// Copies output to the fifo (`None`: containerd wants none; it is read and dropped, so
/// that the process never blocks on a full pipe). At the end of the output it waits
/// until the client has read everything from the fifo: a client deletes the process
/// once it has exited and then stops reading at once (containerd's `cio` closes its
/// end), so what it has not read by then would be lost.
async fn copy_output(mut src: impl AsyncRead + Unpin, mut dst: Option<Sink>) {
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = match src.read(&mut buf).await {
            Ok(0) | Err(_) => break, // EOF; EIO from a pty whose other side closed
            Ok(n) => n,
        };
        if let Some(d) = dst.as_mut() {
            if d.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    }
    if let Some(d) = &dst {
        d.drained().await;
    }
}

/// Bytes in the fifo that no reader has taken yet (0 if it cannot tell).
fn unread(fifo: &pipe::Sender) -> i32 {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int through the pointer, which points at `n`, a
    // live local; the fd is owned by `fifo` for the whole call.
    let rc = unsafe { libc::ioctl(fifo.as_raw_fd(), libc::FIONREAD, &mut n) };
    if rc == 0 {
        n
    } else {
        0
    }
}

/// Opens the input fifo (blocking until the client opens its end), then copies it
/// into the process until EOF, then closes the process's stdin.
async fn copy_input(path: String, dst: StdinWriter) {
    let open = tokio::task::spawn_blocking(move || File::open(&path)).await;
    let Ok(Ok(file)) = open else {
        return;
    };
    let mut src = match pipe::Receiver::from_file(file) {
        Ok(r) => r,
        Err(_) => return,
    };
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = match src.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut guard = dst.lock().await;
        let Some(w) = guard.as_mut() else {
            return;
        };
        // tokio's File buffers a write until flushed; pipes ignore the flush.
        if w.write_all(&buf[..n]).await.is_err() || w.flush().await.is_err() {
            break;
        }
    }
    dst.lock().await.take();
}
