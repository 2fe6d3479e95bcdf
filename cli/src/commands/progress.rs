//! A status line on stderr for commands that can take seconds (`gaps`, `diff`, `conformance`,
//! `coverage`, `bench --corpus`): what the command is doing and for how long, redrawn in place,
//! erased when the work ends. Shown only when stderr is a terminal (never in a pipe or a file,
//! never on stdout); `ATTN_POLICY_PROGRESS=always|never` overrides that (docs/cli.md).

use std::io::{IsTerminal, Write};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Work shorter than this shows nothing on a terminal (no flicker for fast commands).
const DELAY: Duration = Duration::from_millis(400);
/// How often the elapsed time is redrawn.
const TICK: Duration = Duration::from_millis(250);

/// A running status line; dropping it (or [`Progress::finish`]) erases it. Drop it before
/// printing the command's results or errors, so that no line is left half-overwritten.
pub struct Progress {
    text: Arc<Mutex<String>>,
    ticker: Option<(Sender<()>, JoinHandle<()>)>,
}

/// Whether to draw: `ATTN_POLICY_PROGRESS` (`always`, `never`), else whether stderr is a
/// terminal. Returns (draw, delay before the first frame).
fn mode() -> (bool, Duration) {
    match std::env::var("ATTN_POLICY_PROGRESS").as_deref() {
        Ok("always") => (true, Duration::ZERO),
        Ok("never") => (false, DELAY),
        _ => (std::io::stderr().is_terminal(), DELAY),
    }
}

impl Progress {
    /// Starts a status line saying `what` (e.g. "diff: searching every region").
    pub fn start(what: impl Into<String>) -> Progress {
        let text = Arc::new(Mutex::new(what.into()));
        let (show, delay) = mode();
        if !show {
            return Progress { text, ticker: None };
        }
        let (stop, stopped) = mpsc::channel::<()>();
        let shown = text.clone();
        let t0 = Instant::now();
        // Without a delay the first frame is drawn before the work starts (so that even fast
        // work shows it: what `ATTN_POLICY_PROGRESS=always` promises).
        let mut drawn = delay.is_zero();
        if drawn {
            draw(&shown, t0);
        }
        let handle = std::thread::spawn(move || {
            let mut wait = if drawn { TICK } else { delay };
            // Until stopped (or the Progress is gone): redraw on every timeout.
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(wait) {
                draw(&shown, t0);
                drawn = true;
                wait = TICK;
            }
            if drawn {
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "\r\x1b[K");
                let _ = err.flush();
            }
        });
        Progress {
            text,
            ticker: Some((stop, handle)),
        }
    }

    /// Changes what the line says (the next redraw shows it).
    pub fn stage(&self, what: impl Into<String>) {
        if let Ok(mut t) = self.text.lock() {
            *t = what.into();
        }
    }

    /// Erases the line and waits until it is gone (the same as dropping it).
    pub fn finish(self) {}
}

/// Redraws the line: what, and the seconds since `t0`.
fn draw(text: &Mutex<String>, t0: Instant) {
    let what = text.lock().map(|s| s.clone()).unwrap_or_default();
    let mut err = std::io::stderr().lock();
    let _ = write!(err, "\r\x1b[K{what} ({:.0} s)", t0.elapsed().as_secs_f64());
    let _ = err.flush();
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some((stop, handle)) = self.ticker.take() {
            let _ = stop.send(());
            let _ = handle.join();
        }
    }
}
