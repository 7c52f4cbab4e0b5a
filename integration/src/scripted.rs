//! What the scripted LLM servers ([`crate::anthropic`], [`crate::openai`])
//! share: the running server ([`Server`]), a thread per connection on a free
//! port of 127.0.0.1, one HTTP/1 request read per connection, the step at the
//! conversation's place, a step held until the test lets it go, the record of
//! what was asked, and a whole answer written back.

use std::io::{BufRead, BufReader, Read, Write};
use std::marker::PhantomData;
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use serde_json::Value;

/// One request as a scripted server saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    /// The method.
    pub method: String,
    /// The request target (path and query).
    pub target: String,
    /// The body, parsed (`Null` when it was empty or not JSON).
    pub body: Value,
    /// The index of the step it was answered with, for main-loop requests.
    pub step: Option<usize>,
}

/// An LLM API a scripted server speaks: its steps, and how it answers a request.
pub trait Api: 'static {
    /// One answer of its script.
    type Step: Send + Sync + 'static;
    /// The server's name in a failure.
    const NAME: &'static str;
    /// The header that carries the request id, as the API names it.
    const REQUEST_ID_HEADER: &'static str;
    /// The answer to `request` from `script`, and the index of the step it
    /// answered with (main-loop requests); such a step waits first while
    /// `hold` holds it, then for its think time.
    fn answer(
        request: &Request,
        script: &Script<Self::Step>,
        hold: &Hold,
    ) -> (Option<usize>, Reply);
}

/// One request, as [`Api::answer`] reads it.
pub struct Request {
    /// The method.
    pub method: String,
    /// The request target (path and query).
    pub target: String,
    /// The target's path.
    pub path: String,
    /// The body, parsed (`Null` when it was empty or not JSON).
    pub body: Value,
}

/// An answer: its status, its content type and its payload.
pub type Reply = (u16, &'static str, String);

/// A script with the time the LLM "thinks" before each step's answer.
pub struct Script<S> {
    /// The answers, in the conversation's order.
    pub steps: Vec<S>,
    /// Before each one's answer.
    pub think: Vec<Duration>,
}

impl<S> Script<S> {
    /// The step that answers the conversation in `body` ([`step_at`]), once
    /// `hold` lets it go and its think time has passed.
    pub fn step_for(&self, body: &Value, hold: &Hold) -> usize {
        let i = step_at(body, self.steps.len());
        hold.wait_if_held(i);
        std::thread::sleep(self.think[i]);
        i
    }
}

/// A running scripted server of `A`'s API; it lives as long as the test process.
pub struct Server<A: Api> {
    /// Its port on 127.0.0.1.
    pub port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
    hold: Arc<Hold>,
    api: PhantomData<fn() -> A>,
}

impl<A: Api> Server<A> {
    /// Starts serving `steps` on 127.0.0.1 (a free port). Once the script is
    /// used up, a main-loop request gets the last step again.
    pub fn start(steps: Vec<A::Step>) -> Self {
        let think = vec![Duration::ZERO; steps.len()];
        Self::paced(steps, think)
    }

    /// [`Server::start`], each step's answer sent `think[i]` after its request
    /// came (an evaluation's think times; a held step's once let go).
    pub fn paced(steps: Vec<A::Step>, think: Vec<Duration>) -> Self {
        Self::paced_on("127.0.0.1:0", steps, think)
    }

    /// [`Server::paced`] on `addr` (a port of 0: a free one of 127.0.0.1).
    fn paced_on(addr: &str, steps: Vec<A::Step>, think: Vec<Duration>) -> Self {
        Self::serving(steps, think, |answer| {
            listen_on(A::NAME, addr, move |conn| {
                if let Some(request) = read_request(&conn) {
                    answer(conn, request);
                }
            })
        })
    }

    /// [`Server::paced`] behind the process's one listener on `addr` (a fixed
    /// port, for a proxy whose upstream the host's configuration must name in
    /// advance), answering the requests that carry `key` as their bearer token
    /// (`Authorization: Bearer <key>`): many scripts, one per sandbox, behind
    /// one upstream. `key` must be new to the process; every call must name the
    /// same `addr`.
    pub fn paced_by_key(addr: &str, key: &str, steps: Vec<A::Step>, think: Vec<Duration>) -> Self {
        Self::serving(steps, think, |answer| {
            keyed::route(A::NAME, addr, key, Box::new(answer))
        })
    }

    /// A server of `steps`, its requests answered by the function `listen`
    /// hands to its listener; `listen` answers the listener's port.
    fn serving(
        steps: Vec<A::Step>,
        think: Vec<Duration>,
        listen: impl FnOnce(keyed::Handler) -> u16,
    ) -> Self {
        assert!(!steps.is_empty(), "a script needs at least one step");
        assert_eq!(steps.len(), think.len(), "a think time per step");
        let script = Script { steps, think };
        let seen = Arc::new(Mutex::new(Vec::new()));
        let hold = Arc::new(Hold::default());
        let (s, h) = (seen.clone(), hold.clone());
        let port = listen(Box::new(move |conn, request| {
            answer::<A>(conn, request, &script, &h, &s)
        }));
        Server {
            port,
            seen,
            hold,
            api: PhantomData,
        }
    }

    /// See [`Hold::hold_step`].
    pub fn hold_step(&self, step: usize) {
        self.hold.hold_step(step);
    }

    /// See [`Hold::wait_held`].
    pub fn wait_held(&self, timeout: Duration) -> bool {
        self.hold.wait_held(timeout)
    }

    /// See [`Hold::let_go`].
    pub fn let_go(&self) {
        self.hold.let_go();
    }

    /// Its base URL, for the proxy's upstream.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// Serves each connection to `addr` (a port of 0: a free one of 127.0.0.1)
/// with `serve`, in a thread of its own, for as long as the test process lives;
/// answers the port. `what` names the server in a failure; a taken port fails
/// loudly.
pub(crate) fn listen_on(
    what: &str,
    addr: &str,
    serve: impl Fn(TcpStream) + Send + Sync + 'static,
) -> u16 {
    let l = TcpListener::bind(addr).unwrap_or_else(|e| panic!("bind the {what} on {addr}: {e}"));
    let port = l.local_addr().expect("its address").port();
    let serve = Arc::new(serve);
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(conn) = conn else { return };
            let serve = serve.clone();
            std::thread::spawn(move || serve(conn));
        }
    });
    port
}

/// The step of a script of `steps` that answers the conversation in `body`:
/// step `i` answers one holding `i` answers of the assistant (so a request sent
/// again gets the same step); past the end, the last.
fn step_at(body: &Value, steps: usize) -> usize {
    let answered = body["messages"]
        .as_array()
        .map_or(0, |m| m.iter().filter(|m| m["role"] == "assistant").count());
    answered.min(steps - 1)
}

/// A step whose answers wait until the test lets them go: how a test stops a
/// real agent at a chosen place (its request made, its answer not yet come)
/// and crashes its sandbox there.
#[derive(Default)]
pub struct Hold {
    /// (the step held, whether it is let go, how many requests wait on it)
    state: Mutex<(Option<usize>, bool, usize)>,
    changed: Condvar,
}

impl Hold {
    /// From now on, answers to step `step` wait until [`Hold::let_go`], or
    /// until another step is held: holding the next step lets the one held
    /// before go, so a test can stop the agent at two places in a row.
    pub fn hold_step(&self, step: usize) {
        *self.state.lock().unwrap() = (Some(step), false, 0);
        self.changed.notify_all();
    }

    /// Waits until a request for the held step waits (false after `timeout`).
    pub fn wait_held(&self, timeout: Duration) -> bool {
        let s = self.state.lock().unwrap();
        let (s, _) = self
            .changed
            .wait_timeout_while(s, timeout, |s| s.2 == 0)
            .unwrap();
        s.2 > 0
    }

    /// Lets the held step's answers go, and holds nothing more.
    pub fn let_go(&self) {
        self.state.lock().unwrap().1 = true;
        self.changed.notify_all();
    }

    /// Called by a server before it answers step `step`: returns at once
    /// unless that step is held.
    pub(crate) fn wait_if_held(&self, step: usize) {
        let mut s = self.state.lock().unwrap();
        if s.0 != Some(step) {
            return;
        }
        s.2 += 1;
        self.changed.notify_all();
        // Until let go, or until the test holds another step instead.
        while s.0 == Some(step) && !s.1 {
            s = self.changed.wait(s).unwrap();
        }
    }
}

/// Answers `request`, read from `conn`, as `A` does, from `script`; records
/// it in `seen` before the answer is written (no body for a `HEAD`), then closes.
fn answer<A: Api>(
    mut conn: TcpStream,
    request: Read1,
    script: &Script<A::Step>,
    hold: &Hold,
    seen: &Mutex<Vec<Seen>>,
) {
    let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
    let path = request.target.split('?').next().unwrap_or("").to_string();
    let request = Request {
        method: request.method,
        target: request.target,
        path,
        body,
    };
    let (step, (status, content_type, payload)) = A::answer(&request, script, hold);
    let head_only = request.method == "HEAD";
    let Request {
        method,
        target,
        body,
        ..
    } = request;
    seen.lock().unwrap().push(Seen {
        method,
        target,
        body,
        step,
    });
    let reason = if status == 200 { "OK" } else { "Not Found" };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         {}: req_crab\r\nConnection: close\r\n\r\n",
        payload.len(),
        A::REQUEST_ID_HEADER,
    );
    let _ = conn.write_all(head.as_bytes());
    if !head_only {
        let _ = conn.write_all(payload.as_bytes());
    }
    let _ = conn.flush();
}

/// One HTTP/1 request as read from its connection.
pub(crate) struct Read1 {
    method: String,
    target: String,
    /// Its bearer token (`Authorization: Bearer <key>`), if any.
    key: Option<String>,
    body: Vec<u8>,
}

/// Reads one HTTP/1 request: method, target, bearer token and body (by
/// Content-Length or chunked).
fn read_request(conn: &TcpStream) -> Option<Read1> {
    let mut r = BufReader::new(conn.try_clone().ok()?);
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let mut words = line.split_whitespace();
    let (method, target) = (words.next()?.to_string(), words.next()?.to_string());
    let (mut len, mut chunked, mut key) = (0usize, false, None);
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).ok()? == 0 || h == "\r\n" {
            break;
        }
        let (name, value) = h.split_once(':').unwrap_or((&h, ""));
        let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
        match name.as_str() {
            "content-length" => len = value.parse().ok()?,
            "transfer-encoding" => chunked |= value.to_ascii_lowercase().contains("chunked"),
            "authorization" => key = value.strip_prefix("Bearer ").map(str::to_string),
            _ => {}
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            let mut size = String::new();
            r.read_line(&mut size).ok()?;
            let n = usize::from_str_radix(size.trim().split(';').next()?, 16).ok()?;
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk).ok()?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    } else {
        body.resize(len, 0);
        r.read_exact(&mut body).ok()?;
    }
    Some(Read1 {
        method,
        target,
        key,
        body,
    })
}

/// The process's one listener that answers each request by its bearer token
/// ([`Server::paced_by_key`]).
mod keyed {
    use std::collections::HashMap;
    use std::io::Write;
    use std::net::TcpStream;
    use std::sync::{Mutex, OnceLock};

    use super::{listen_on, read_request, Read1};

    pub(super) type Handler = Box<dyn Fn(TcpStream, Read1) + Send + Sync>;

    struct Routes {
        addr: String,
        port: u16,
        by_key: Mutex<HashMap<String, std::sync::Arc<Handler>>>,
    }

    static ROUTES: OnceLock<Routes> = OnceLock::new();

    /// Routes the requests carrying `key` to `handler`; starts the listener on
    /// `addr` at the first call. Answers its port.
    pub(super) fn route(what: &str, addr: &str, key: &str, handler: Handler) -> u16 {
        let routes = ROUTES.get_or_init(|| Routes {
            addr: addr.to_string(),
            port: listen_on(what, addr, dispatch),
            by_key: Mutex::new(HashMap::new()),
        });
        assert_eq!(routes.addr, addr, "one keyed listener per process");
        let old = routes
            .by_key
            .lock()
            .unwrap()
            .insert(key.to_string(), std::sync::Arc::new(handler));
        assert!(old.is_none(), "the key {key:?} is taken");
        routes.port
    }

    fn dispatch(mut conn: TcpStream) {
        let Some(request) = read_request(&conn) else {
            return;
        };
        let handler = request.key.as_ref().and_then(|k| {
            let routes = ROUTES.get()?;
            let by_key = routes.by_key.lock().unwrap();
            by_key.get(k).cloned()
        });
        match handler {
            Some(h) => h(conn, request),
            None => {
                eprintln!(
                    "scripted server: {} {} with no known key",
                    request.method, request.target
                );
                let _ = conn.write_all(
                    b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                );
            }
        }
    }
}
