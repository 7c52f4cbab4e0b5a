//! The ttrpc adapter: each RPC forwards to the [`TaskService`] method of the same name.

use async_trait::async_trait;
use containerd_shim::api::*;
use containerd_shim::protos::shim_async::Task;
use containerd_shim::protos::ttrpc::r#async::TtrpcContext;
use containerd_shim::TtrpcResult;

use crate::task::TaskService;

#[async_trait]
impl Task for TaskService {
    async fn state(&self, _: &TtrpcContext, r: StateRequest) -> TtrpcResult<StateResponse> {
        Ok(TaskService::state(self, r).await?)
    }
    async fn create(
        &self,
        _: &TtrpcContext,
        r: CreateTaskRequest,
    ) -> TtrpcResult<CreateTaskResponse> {
        Ok(TaskService::create(self, r).await?)
    }
    async fn start(&self, _: &TtrpcContext, r: StartRequest) -> TtrpcResult<StartResponse> {
        Ok(TaskService::start(self, r).await?)
    }
    async fn delete(&self, _: &TtrpcContext, r: DeleteRequest) -> TtrpcResult<DeleteResponse> {
        Ok(TaskService::delete(self, r).await?)
    }
    async fn pids(&self, _: &TtrpcContext, r: PidsRequest) -> TtrpcResult<PidsResponse> {
        Ok(TaskService::pids(self, r).await?)
    }
    async fn pause(&self, _: &TtrpcContext, r: PauseRequest) -> TtrpcResult<Empty> {
        TaskService::pause(self, r).await?;
        Ok(Empty::new())
    }
    async fn resume(&self, _: &TtrpcContext, r: ResumeRequest) -> TtrpcResult<Empty> {
        TaskService::resume(self, r).await?;
        Ok(Empty::new())
    }
    async fn kill(&self, _: &TtrpcContext, r: KillRequest) -> TtrpcResult<Empty> {
        TaskService::kill(self, r).await?;
        Ok(Empty::new())
    }
    async fn exec(&self, _: &TtrpcContext, r: ExecProcessRequest) -> TtrpcResult<Empty> {
        TaskService::exec(self, r).await?;
        Ok(Empty::new())
    }
    async fn resize_pty(&self, _: &TtrpcContext, r: ResizePtyRequest) -> TtrpcResult<Empty> {
        TaskService::resize_pty(self, r).await?;
        Ok(Empty::new())
    }
    async fn close_io(&self, _: &TtrpcContext, r: CloseIORequest) -> TtrpcResult<Empty> {
        TaskService::close_io(self, r).await?;
        Ok(Empty::new())
    }
    async fn update(&self, _: &TtrpcContext, r: UpdateTaskRequest) -> TtrpcResult<Empty> {
        TaskService::update(self, r).await?;
        Ok(Empty::new())
    }
    async fn wait(&self, _: &TtrpcContext, r: WaitRequest) -> TtrpcResult<WaitResponse> {
        Ok(TaskService::wait(self, r).await?)
    }
    async fn stats(&self, _: &TtrpcContext, r: StatsRequest) -> TtrpcResult<StatsResponse> {
        Ok(TaskService::stats(self, r).await?)
    }
    async fn connect(&self, _: &TtrpcContext, r: ConnectRequest) -> TtrpcResult<ConnectResponse> {
        Ok(TaskService::connect(self, r).await?)
    }
    async fn checkpoint(&self, _: &TtrpcContext, r: CheckpointTaskRequest) -> TtrpcResult<Empty> {
        TaskService::checkpoint(self, r).await?;
        Ok(Empty::new())
    }
    async fn shutdown(&self, _: &TtrpcContext, r: ShutdownRequest) -> TtrpcResult<Empty> {
        TaskService::shutdown(self, r).await?;
        Ok(Empty::new())
    }
}
