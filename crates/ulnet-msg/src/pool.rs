//! The worker pool that runs pooled handlers off the polling thread.

use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

/// A unit of work.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// Fixed threads taking jobs from one queue. Dropping the pool finishes queued jobs and
/// joins the threads.
pub(crate) struct WorkerPool {
    jobs: Option<mpsc::Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

impl WorkerPool {
    pub(crate) fn new(workers: usize) -> Self {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let threads = (0..workers)
            .map(|i| {
                let rx = rx.clone();
                std::thread::Builder::new()
                    .name(format!("ulnet-rpc-{i}"))
                    .spawn(move || loop {
                        let job = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                        match job {
                            Ok(job) => job(),
                            Err(_) => return,
                        }
                    })
                    .expect("spawn RPC worker")
            })
            .collect();
        Self { jobs: Some(tx), threads }
    }

    pub(crate) fn submit(&self, job: Job) {
        if let Some(jobs) = &self.jobs {
            let _ = jobs.send(job);
        }
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.jobs.take();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
