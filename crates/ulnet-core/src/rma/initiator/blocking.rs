//! Blocking helpers: post an operation and wait for its completion, keeping every other
//! completion that arrives meanwhile for the caller's next [`Rma::poll`].

use super::completion::{Owned, Value};
use super::*;

impl Rma {
    fn next_internal_token(&mut self) -> u64 {
        self.internal_tokens = self.internal_tokens.wrapping_add(1);
        self.internal_tokens
    }

    /// Polls (and, once a short spin is over, sleeps) until the internal operation `token`
    /// finishes, keeping every other completion for the user's next poll. A get's data is
    /// copied into `dst`.
    fn wait_internal(&mut self, token: u64, deadline: Instant, dst: &mut [u8]) -> Result<Captured, RmaError> {
        let spin_until = Instant::now() + Duration::from_micros(50);
        loop {
            if let EngineRunner::Inline(engine) = &mut self.engine {
                engine.progress();
            }
            let mut captured: Option<Result<Captured, RmaError>> = None;
            let mut stash = Vec::new();
            self.poll_channels(usize::MAX, &mut |internal, t, r| {
                if internal {
                    if t == token {
                        captured = Some(r.map(|v| match v {
                            Value::Put => Captured::Done,
                            Value::Get(d) => {
                                let n = d.len().min(dst.len());
                                dst[..n].copy_from_slice(&d[..n]);
                                Captured::Done
                            }
                            Value::Atomic(v) => Captured::Word(v),
                            Value::Lookup(a) => Captured::Lookup(a),
                        }));
                    }
                    return;
                }
                stash.push((t, r.map(Owned::of)));
            });
            self.stash.extend(stash);
            let mut flushed = Vec::new();
            self.complete_flushes(&mut |t| flushed.push(t));
            self.stash.extend(flushed.into_iter().map(|t| (t, Ok(Owned::Flush))));
            if let Some(r) = captured {
                return r;
            }
            let now = Instant::now();
            if now >= deadline {
                self.abandon(token);
                return Err(RmaError::Timeout);
            }
            if now > spin_until {
                let _ = self.wait(Some((deadline - now).min(Duration::from_millis(1))));
            }
        }
    }

    /// Forgets an internal operation a blocking helper stopped waiting for.
    fn abandon(&mut self, token: u64) {
        for slot in &mut self.slots {
            if slot.live && slot.internal && slot.token == token {
                slot.abandoned = true;
            }
        }
    }

    /// Retries a post that met `NoResource` until it goes or `deadline` passes.
    /// Polls the channels and runs the engine, keeping every user completion that arrives
    /// for [`Rma::poll`] (a blocking helper waiting for something else).
    fn poll_keeping_completions(&mut self) {
        let mut stash = Vec::new();
        self.poll_channels(usize::MAX, &mut |internal, t, r| {
            if !internal {
                stash.push((t, r.map(Owned::of)));
            }
        });
        self.stash.extend(stash);
        self.progress();
    }

    fn retry<T>(
        &mut self,
        deadline: Instant,
        mut post: impl FnMut(&mut Self) -> Result<RmaOutcome<T>, RmaError>,
    ) -> Result<RmaOutcome<T>, RmaError> {
        loop {
            match post(self)? {
                RmaOutcome::NoResource => {}
                other => return Ok(other),
            }
            if Instant::now() >= deadline {
                return Err(RmaError::Timeout);
            }
            self.poll_keeping_completions();
        }
    }

    /// Reads into `dst` and waits for the data (for code that just wants the answer).
    /// Completions of other operations that arrive meanwhile are kept for [`Rma::poll`].
    pub fn get_blocking(
        &mut self,
        seg: &RemoteSegment,
        offset: u64,
        dst: &mut [u8],
        timeout: Duration,
    ) -> Result<(), RmaError> {
        let deadline = Instant::now() + timeout;
        let token = self.next_internal_token();
        match self.retry(deadline, |rma| rma.get_with(seg, offset, dst, token, true))? {
            RmaOutcome::Done(()) => Ok(()),
            _ => self.wait_internal(token, deadline, dst).map(|_| ()),
        }
    }

    /// Writes `data` and waits until the target has applied it.
    pub fn put_blocking(
        &mut self,
        seg: &RemoteSegment,
        offset: u64,
        data: &[u8],
        timeout: Duration,
    ) -> Result<(), RmaError> {
        let deadline = Instant::now() + timeout;
        let token = self.next_internal_token();
        match self.retry(deadline, |rma| rma.put_with(seg, offset, data, token, true))? {
            RmaOutcome::Done(()) => Ok(()),
            _ => self.wait_internal(token, deadline, &mut []).map(|_| ()),
        }
    }

    fn atomic_blocking(
        &mut self,
        seg: &RemoteSegment,
        offset: u64,
        cas: Option<(u64, u64)>,
        addend: u64,
        timeout: Duration,
    ) -> Result<u64, RmaError> {
        let deadline = Instant::now() + timeout;
        let token = self.next_internal_token();
        match self.retry(deadline, |rma| rma.atomic_with(seg, offset, cas, addend, token, true))? {
            RmaOutcome::Done(old) => Ok(old),
            _ => match self.wait_internal(token, deadline, &mut [])? {
                Captured::Word(old) => Ok(old),
                _ => Err(RmaError::Access(AccessError::Malformed)),
            },
        }
    }

    /// Compare-and-swap, waiting for the answer: returns the value the word held before.
    pub fn compare_and_swap_blocking(
        &mut self,
        seg: &RemoteSegment,
        offset: u64,
        expected: u64,
        desired: u64,
        timeout: Duration,
    ) -> Result<u64, RmaError> {
        self.atomic_blocking(seg, offset, Some((expected, desired)), 0, timeout)
    }

    /// Fetch-and-add, waiting for the answer: returns the value the word held before.
    pub fn fetch_and_add_blocking(
        &mut self,
        seg: &RemoteSegment,
        offset: u64,
        addend: u64,
        timeout: Duration,
    ) -> Result<u64, RmaError> {
        self.atomic_blocking(seg, offset, None, addend, timeout)
    }

    /// Waits until every operation posted so far has completed; their completions stay
    /// for [`Rma::poll`].
    pub fn flush_blocking(&mut self, timeout: Duration) -> Result<(), RmaError> {
        let deadline = Instant::now() + timeout;
        let marks = self.in_flight_marks();
        loop {
            let done = marks.iter().all(|&(p, mark)| {
                self.peers[p as usize].channel.as_ref().is_none_or(|c| c.answered >= mark || c.down.is_some())
            });
            if done {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(RmaError::Timeout);
            }
            self.poll_keeping_completions();
        }
    }

    /// Asks `peer` for the segment exported under `name`.
    pub(super) fn lookup_blocking(&mut self, index: usize, name: &str) -> Result<LookupAnswer, ImportError> {
        let deadline = Instant::now() + self.config.control_timeout;
        let token = self.next_internal_token();
        let op = |_: &[u8], _: u64, _: usize| Op::Lookup { name: name.as_bytes() };
        let posted =
            self.retry(deadline, |rma| rma.post(index as u32, false, token, Kind::Lookup, 0, op, &[], true, None));
        let to_import_error = |e: RmaError| match e {
            RmaError::Access(a) => ImportError::Access(a),
            RmaError::PeerFailed(c) => ImportError::PeerFailed(c),
            RmaError::Timeout => ImportError::Timeout,
            _ => ImportError::Protocol("lookup failed"),
        };
        let _in_progress = posted.map_err(to_import_error)?;
        match self.wait_internal(token, deadline, &mut []).map_err(to_import_error)? {
            Captured::Lookup(answer) => Ok(answer),
            _ => Err(ImportError::Protocol("lookup answered with something else")),
        }
    }
}

/// What a blocking helper captured.
pub(super) enum Captured {
    Done,
    Word(u64),
    Lookup(LookupAnswer),
}
