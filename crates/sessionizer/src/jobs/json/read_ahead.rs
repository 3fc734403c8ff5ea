//! The reader thread of the file and stdin driver: batches of whole lines are read one
//! ahead of the workers, so that reading (mostly the kernel copying file pages)
//! overlaps decoding and sessionizing.

use super::BATCH_BYTES;
use crate::error::RunError;
use sessionizer_connectors::input::{Batch, InputError, Inputs};
use std::time::Duration;

/// Reads batches on a thread of its own, one batch ahead of the workers, so that reading
/// (mostly the kernel copying file pages) overlaps decoding and sessionizing.
pub(super) struct ReadAhead {
    full: std::sync::mpsc::Receiver<Result<Option<Batch>, InputError>>,
    empty: std::sync::mpsc::SyncSender<Batch>,
    thread: std::thread::JoinHandle<u64>,
}

impl ReadAhead {
    pub(super) fn start(mut inputs: Inputs) -> Result<ReadAhead, RunError> {
        let (full_tx, full) = std::sync::mpsc::sync_channel::<Result<Option<Batch>, InputError>>(1);
        let (empty, empty_rx) = std::sync::mpsc::sync_channel::<Batch>(2);
        for _ in 0..2 {
            let _ = empty.send(Batch::default());
        }
        let thread = std::thread::Builder::new()
            .name("sessionizer-reader".into())
            .spawn(move || {
                // Stops when the inputs end, on an error, or when the job hangs up.
                while let Ok(mut batch) = empty_rx.recv() {
                    match inputs.next_batch(&mut batch, BATCH_BYTES) {
                        Ok(true) => {
                            if full_tx.send(Ok(Some(batch))).is_err() {
                                break;
                            }
                        }
                        Ok(false) => {
                            // The end is said out loud: a closed channel without it
                            // means the reader died, not that the input ended.
                            let _ = full_tx.send(Ok(None));
                            break;
                        }
                        Err(e) => {
                            let _ = full_tx.send(Err(e));
                            break;
                        }
                    }
                }
                inputs.bytes_read()
            })
            .map_err(|e| RunError::Workers {
                workers: 1,
                message: format!("reader thread: {e}"),
            })?;
        Ok(ReadAhead {
            full,
            empty,
            thread,
        })
    }

    /// What the reader has ready now, without waiting (`None`: the job would wait).
    pub(super) fn ready(&mut self) -> Result<Option<Next>, RunError> {
        use std::sync::mpsc::TryRecvError;
        match self.full.try_recv() {
            Ok(received) => Self::next_of(received).map(Some),
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => Err(RunError::ReaderFailed),
        }
    }

    /// The next batch, the end of the inputs, or — when `wait` is given and no batch
    /// came within it — `Next::Idle`.
    pub(super) fn next_within(&mut self, wait: Option<Duration>) -> Result<Next, RunError> {
        use std::sync::mpsc::RecvTimeoutError;
        let received = match wait {
            None => self.full.recv().map_err(|_| RunError::ReaderFailed),
            Some(d) => match self.full.recv_timeout(d) {
                Ok(r) => Ok(r),
                Err(RecvTimeoutError::Timeout) => return Ok(Next::Idle),
                Err(RecvTimeoutError::Disconnected) => Err(RunError::ReaderFailed),
            },
        }?;
        Self::next_of(received)
    }

    fn next_of(received: Result<Option<Batch>, InputError>) -> Result<Next, RunError> {
        match received {
            Ok(Some(batch)) => Ok(Next::Batch(batch)),
            Ok(None) => Ok(Next::End),
            Err(e) => Err(e.into()),
        }
    }

    /// Hands a processed batch back for reuse of its buffers.
    pub(super) fn recycle(&self, batch: Batch) {
        let _ = self.empty.send(batch);
    }

    /// Stops reading without waiting for the reader (it may be blocked on stdin): it
    /// ends when its next read returns.
    pub(super) fn abandon(self) {
        drop(self.full);
        drop(self.empty);
    }

    /// Bytes read in all.
    pub(super) fn finish(self) -> Result<u64, RunError> {
        drop(self.empty);
        self.thread.join().map_err(|_| RunError::ReaderFailed)
    }
}

/// The inputs that ended inside `batch` (all but the one its last line is in), with
/// their last line numbers.
pub(super) fn finished_inputs(batch: &Batch, out: &mut Vec<(u32, u64)>) {
    out.clear();
    let (Some(first), Some(last)) = (batch.lines.first(), batch.lines.last()) else {
        return;
    };
    if first.input == last.input {
        return;
    }
    for l in batch.lines.iter().rev() {
        if l.input != last.input && out.last().is_none_or(|&(i, _)| i != l.input) {
            out.push((l.input, l.at));
        }
    }
}

/// What the reader has for the job.
pub(super) enum Next {
    Batch(Batch),
    End,
    /// Nothing arrived within the wait.
    Idle,
}
