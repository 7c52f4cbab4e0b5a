//! The server half of containerd's snapshots service (`containerd.services.snapshots.v1`),
//! generated over the message types `containerd-client` already has (it builds only
//! clients): no proto file is compiled here.

use tonic_build::manual::{Builder, Method, Service};

const TYPES: &str = "containerd_client::services::v1::snapshots";

fn method(
    name: &str,
    route: &str,
    input: &str,
    output: &str,
) -> tonic_build::manual::MethodBuilder {
    let ty = |t: &str| {
        if t == "Empty" {
            "crate::proto::Empty".to_string()
        } else {
            format!("{TYPES}::{t}")
        }
    };
    Method::builder()
        .name(name)
        .route_name(route)
        .input_type(ty(input))
        .output_type(ty(output))
        .codec_path("tonic::codec::ProstCodec")
}

fn main() {
    let service = Service::builder()
        .name("Snapshots")
        .package("containerd.services.snapshots.v1")
        .method(
            method(
                "prepare",
                "Prepare",
                "PrepareSnapshotRequest",
                "PrepareSnapshotResponse",
            )
            .build(),
        )
        .method(
            method(
                "view",
                "View",
                "ViewSnapshotRequest",
                "ViewSnapshotResponse",
            )
            .build(),
        )
        .method(method("mounts", "Mounts", "MountsRequest", "MountsResponse").build())
        .method(method("commit", "Commit", "CommitSnapshotRequest", "Empty").build())
        .method(method("remove", "Remove", "RemoveSnapshotRequest", "Empty").build())
        .method(
            method(
                "stat",
                "Stat",
                "StatSnapshotRequest",
                "StatSnapshotResponse",
            )
            .build(),
        )
        .method(
            method(
                "update",
                "Update",
                "UpdateSnapshotRequest",
                "UpdateSnapshotResponse",
            )
            .build(),
        )
        .method(
            method(
                "list",
                "List",
                "ListSnapshotsRequest",
                "ListSnapshotsResponse",
            )
            .server_streaming()
            .build(),
        )
        .method(method("usage", "Usage", "UsageRequest", "UsageResponse").build())
        .method(method("cleanup", "Cleanup", "CleanupRequest", "Empty").build())
        .build();
    Builder::new().build_client(false).compile(&[service]);
}
