//! A status line on stderr for commands that can take seconds (`gaps`, `diff`, `matrix`,
//! `conformance`, `coverage`, `bench --corpus`): what the command is doing and for how long, redrawn in place,
//! erased when the work ends. Shown only when stderr is a terminal (never in a pipe or a file,
//! never on stdout); `ATTN_POLICY_PROGRESS=always|never` overrides that (docs/cli.md).

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// The line is on the terminal: a new stage is drawn at once, not at the next tick.
    visible: Arc<AtomicBool>,
    t0: Instant,
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
        let visible = Arc::new(AtomicBool::new(false));
        let t0 = Instant::now();
        let (show, delay) = mode();
        if !show {
            return Progress {
                text,
                visible,
                t0,
                ticker: None,
            };
        }
        let (stop, stopped) = mpsc::channel::<()>();
        let (shown, drawn) = (text.clone(), visible.clone());
        // Without a delay the first frame is drawn before the work starts (so that even fast
        // work shows it: what `ATTN_POLICY_PROGRESS=always` promises).
        if delay.is_zero() {
            draw(&shown, t0);
            drawn.store(true, Ordering::SeqCst);
        }
        let handle = std::thread::spawn(move || {
            let mut wait = if delay.is_zero() { TICK } else { delay };
            // Until stopped (or the Progress is gone): redraw on every timeout.
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(wait) {
                draw(&shown, t0);
                drawn.store(true, Ordering::SeqCst);
                wait = TICK;
            }
            if drawn.load(Ordering::SeqCst) {
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "\r\x1b[K");
                let _ = err.flush();
            }
        });
        Progress {
            text,
            visible,
            t0,
            ticker: Some((stop, handle)),
        }
    }

    /// Changes what the line says: at once if it is on the terminal, else when it appears.
    pub fn stage(&self, what: impl Into<String>) {
        if let Ok(mut t) = self.text.lock() {
            *t = what.into();
        }
        if self.visible.load(Ordering::SeqCst) {
            draw(&self.text, self.t0);
        }
    }

    /// Erases the line and waits until it is gone (the same as dropping it).
    pub fn finish(self) {}

    /// Erases the line, then reports `message` as the command's error ([`super::fail`]): the
    /// error must not be drawn over by the line.
    pub fn fail(self, message: impl std::fmt::Display) -> i32 {
        drop(self);
        super::fail(message)
    }
}

/// Redraws the line: what, and the seconds since `t0`, cut to the terminal's width (`$COLUMNS`,
/// else 80): a line that wrapped could not be redrawn in place.
fn draw(text: &Mutex<String>, t0: Instant) {
    let what = text.lock().map(|s| s.clone()).unwrap_or_default();
    let secs = format!(" ({:.0} s)", t0.elapsed().as_secs_f64());
    let width = std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse::<usize>().ok())
        .unwrap_or(80);
    let room = width.saturating_sub(secs.len() + 1);
    let line = if what.chars().count() > room {
        let cut: String = what.chars().take(room.saturating_sub(1)).collect();
        format!("{cut}\u{2026}{secs}")
    } else {
        format!("{what}{secs}")
    };
    let mut err = std::io::stderr().lock();
    let _ = write!(err, "\r\x1b[K{line}");
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
