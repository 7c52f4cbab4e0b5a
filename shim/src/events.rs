//! Publishing task events to containerd, in order.

use std::sync::Arc;

use containerd_shim::event::Event;
use containerd_shim::publisher::RemotePublisher;
use containerd_shim::Context;

/// A cloneable handle that publishes events of one namespace.
#[derive(Clone)]
pub struct Events {
    publisher: Arc<RemotePublisher>,
    namespace: String,
}

impl Events {
    /// Wraps containerd's publisher.
    pub fn new(publisher: RemotePublisher, namespace: &str) -> Events {
        Events {
            publisher: Arc::new(publisher),
            namespace: namespace.to_string(),
        }
    }

    /// Publishes one event. The publisher queues events in call order; callers publish
    /// while holding the task state lock, so containerd sees them in lifecycle order.
    pub async fn publish(&self, event: impl Event + 'static) {
        let topic = event.topic();
        if let Err(e) = self
            .publisher
            .publish(Context::default(), &topic, &self.namespace, Box::new(event))
            .await
        {
            tracing::warn!(%topic, error = %e, "failed to publish event");
        }
    }
}
