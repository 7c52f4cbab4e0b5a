//! The gRPC adapter: containerd's snapshots service over [`Snapshotter`]. Each call
//! runs the (blocking) operation on tokio's blocking pool and maps its error once
//! ([`crate::error`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use containerd_client::services::v1::snapshots as api;
use tonic::{Request, Response, Status};

use crate::meta::{Kind, Record};
use crate::proto::snapshots_server::Snapshots;
use crate::proto::Empty;
use crate::snapshotter::Snapshotter;

/// Snapshots a List response carries at most.
const LIST_CHUNK: usize = 100;

/// The service containerd's proxy plugin calls.
#[derive(Clone)]
pub struct Service {
    inner: Arc<Snapshotter>,
}

impl Service {
    /// Serves `snapshotter`.
    pub fn new(snapshotter: Snapshotter) -> Service {
        Service {
            inner: Arc::new(snapshotter),
        }
    }

    async fn run<T: Send + 'static>(
        &self,
        op: impl FnOnce(&Snapshotter) -> crate::Result<T> + Send + 'static,
    ) -> Result<T, Status> {
        let s = self.inner.clone();
        tokio::task::spawn_blocking(move || op(&s))
            .await
            .map_err(|e| Status::internal(format!("snapshotter task: {e}")))?
            .map_err(Status::from)
    }
}

fn labels(map: std::collections::HashMap<String, String>) -> BTreeMap<String, String> {
    map.into_iter().collect()
}

fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    prost_types::Timestamp::from(t)
}

/// containerd's view of a record.
pub fn info(key: &str, rec: &Record) -> api::Info {
    let kind = match rec.kind {
        Kind::View => api::Kind::View,
        Kind::Active => api::Kind::Active,
        Kind::Committed => api::Kind::Committed,
    };
    api::Info {
        name: key.to_string(),
        parent: rec.parent.clone().unwrap_or_default(),
        kind: kind as i32,
        created_at: Some(timestamp(rec.created)),
        updated_at: Some(timestamp(rec.updated)),
        labels: rec.labels.clone().into_iter().collect(),
    }
}

#[tonic::async_trait]
impl Snapshots for Service {
    async fn prepare(
        &self,
        r: Request<api::PrepareSnapshotRequest>,
    ) -> Result<Response<api::PrepareSnapshotResponse>, Status> {
        let r = r.into_inner();
        let mounts = self
            .run(move |s| s.create(Kind::Active, &r.key, &r.parent, labels(r.labels)))
            .await?;
        Ok(Response::new(api::PrepareSnapshotResponse { mounts }))
    }

    async fn view(
        &self,
        r: Request<api::ViewSnapshotRequest>,
    ) -> Result<Response<api::ViewSnapshotResponse>, Status> {
        let r = r.into_inner();
        let mounts = self
            .run(move |s| s.create(Kind::View, &r.key, &r.parent, labels(r.labels)))
            .await?;
        Ok(Response::new(api::ViewSnapshotResponse { mounts }))
    }

    async fn mounts(
        &self,
        r: Request<api::MountsRequest>,
    ) -> Result<Response<api::MountsResponse>, Status> {
        let key = r.into_inner().key;
        let mounts = self.run(move |s| s.mounts(&key)).await?;
        Ok(Response::new(api::MountsResponse { mounts }))
    }

    async fn commit(
        &self,
        r: Request<api::CommitSnapshotRequest>,
    ) -> Result<Response<Empty>, Status> {
        let r = r.into_inner();
        self.run(move |s| s.commit(&r.name, &r.key, labels(r.labels)))
            .await?;
        Ok(Response::new(()))
    }

    async fn remove(
        &self,
        r: Request<api::RemoveSnapshotRequest>,
    ) -> Result<Response<Empty>, Status> {
        let key = r.into_inner().key;
        self.run(move |s| s.remove(&key)).await?;
        Ok(Response::new(()))
    }

    async fn stat(
        &self,
        r: Request<api::StatSnapshotRequest>,
    ) -> Result<Response<api::StatSnapshotResponse>, Status> {
        let key = r.into_inner().key;
        let rec = self
            .run({
                let key = key.clone();
                move |s| s.stat(&key)
            })
            .await?;
        Ok(Response::new(api::StatSnapshotResponse {
            info: Some(info(&key, &rec)),
        }))
    }

    async fn update(
        &self,
        r: Request<api::UpdateSnapshotRequest>,
    ) -> Result<Response<api::UpdateSnapshotResponse>, Status> {
        let r = r.into_inner();
        let i = r
            .info
            .ok_or_else(|| Status::invalid_argument("update without info"))?;
        let paths = r.update_mask.map(|m| m.paths).unwrap_or_default();
        let key = i.name.clone();
        let rec = self
            .run({
                let key = key.clone();
                move |s| s.update(&key, labels(i.labels), &paths)
            })
            .await?;
        Ok(Response::new(api::UpdateSnapshotResponse {
            info: Some(info(&key, &rec)),
        }))
    }

    type ListStream =
        tokio_stream::Iter<std::vec::IntoIter<Result<api::ListSnapshotsResponse, Status>>>;

    async fn list(
        &self,
        r: Request<api::ListSnapshotsRequest>,
    ) -> Result<Response<Self::ListStream>, Status> {
        if !r.get_ref().filters.is_empty() {
            // containerd filters its own records; only its garbage collection walks
            // a snapshotter, and it sends none.
            return Err(Status::unimplemented("filters on a snapshot walk"));
        }
        let all = self.run(|s| Ok(s.list())).await?;
        let chunks: Vec<_> = all
            .chunks(LIST_CHUNK)
            .map(|c| api::ListSnapshotsResponse {
                info: c.iter().map(|(k, r)| info(k, r)).collect(),
            })
            .map(Result::Ok)
            .collect();
        Ok(Response::new(tokio_stream::iter(chunks)))
    }

    async fn usage(
        &self,
        r: Request<api::UsageRequest>,
    ) -> Result<Response<api::UsageResponse>, Status> {
        let key = r.into_inner().key;
        let u = self.run(move |s| s.usage(&key)).await?;
        let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        Ok(Response::new(api::UsageResponse {
            size: clamp(u.bytes),
            inodes: clamp(u.inodes),
        }))
    }

    async fn cleanup(&self, _r: Request<api::CleanupRequest>) -> Result<Response<Empty>, Status> {
        let removed = self.run(|s| s.cleanup()).await?;
        if !removed.is_empty() {
            tracing::info!(?removed, "snapshot directories without a record removed");
        }
        Ok(Response::new(()))
    }
}
