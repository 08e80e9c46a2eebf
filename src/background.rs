//! A service's background tasks: stopped and awaited when the server has stopped
//! ([`BackgroundTasks::stop`], from `Application::run_until_stopped`), so that nothing of a
//! stopped instance reads or writes the store any more; aborted without waiting if the
//! service is dropped first.

use std::sync::Mutex;

use tokio::task::JoinHandle;

#[derive(Default)]
pub struct BackgroundTasks(Mutex<Vec<JoinHandle<()>>>);

impl BackgroundTasks {
    pub fn new(tasks: Vec<JoinHandle<()>>) -> Self {
        Self(Mutex::new(tasks))
    }

    pub fn push(&self, task: JoinHandle<()>) {
        self.0.lock().expect("tasks lock").push(task);
    }

    /// Aborts every task and waits until each has ended. Later calls do nothing.
    pub async fn stop(&self) {
        let tasks = std::mem::take(&mut *self.0.lock().expect("tasks lock"));
        for t in &tasks {
            t.abort();
        }
        for t in tasks {
            let _ = t.await;
        }
    }
}

impl Drop for BackgroundTasks {
    fn drop(&mut self) {
        let tasks = self.0.get_mut().unwrap_or_else(|p| p.into_inner());
        for t in tasks.iter() {
            t.abort();
        }
    }
}
