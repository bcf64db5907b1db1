//! Every route of the API, stated once: its method, its path as a template, the operation
//! it carries (and so the role it needs: `ops::access`), its metric name prefix (Clamp's
//! where Clamp had one), and whether it is open without a token. The router and its
//! `405 Allow` (http), the token check, span names (`http.route`) and the per-route
//! metrics all read this table; a test holds openapi.json to it. Adding a route is a row
//! here, a handler, and its place in openapi.json.

/// The operations, as their roles group them (`ops::access` says which role each needs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Every read: a request, lists, search, counts, workflows, versions, schedules,
    /// metrics, the console's pages.
    Read,
    /// Creating a service request.
    Create,
    Cancel,
    Retry,
    BulkRetry,
    Rerun,
    /// A paused step's answer (`POST /stepResponse`).
    StepResponse,
    /// An event delivered to the requests waiting for it.
    DeliverEvent,
    /// Defining or replacing a workflow (a new version).
    DefineWorkflow,
    /// Pausing a workflow's requests, and resuming them.
    PauseWorkflow,
    ResumeWorkflow,
    /// Defining, replacing, deleting, triggering, pausing or resuming a schedule.
    ChangeSchedule,
    /// Defining, replacing, deleting, pausing or resuming a trigger.
    ChangeTrigger,
    /// A webhook's delivery (open: its signature is its proof).
    Hook,
    /// Reading the audit trail.
    ReadAudit,
}

/// One route, as the table states it.
#[derive(Debug)]
pub struct RouteDef {
    pub route: Route,
    /// `GET`, `POST`, …; empty for the two rows the table does not route (the console's
    /// pages, which route themselves, and no route at all).
    pub method: &'static str,
    /// Its path; `{name}` stands for one non-empty segment handed to the handler.
    pub template: &'static str,
    pub op: Op,
    /// Its metrics are `<metric>_counter` and `<metric>_histogram`.
    pub metric: &'static str,
    /// Answered without a token.
    pub open: bool,
}

macro_rules! routes {
    ($($route:ident = $method:literal $template:literal, $op:ident, $metric:literal, $open:literal;)*) => {
        /// The routes, in the table's order (`ROUTES[route as usize]` is its row).
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(usize)]
        pub enum Route {
            $($route,)*
        }

        /// Every route, in `Route`'s order; the router tries them in this order.
        pub const ROUTES: &[RouteDef] = &[$(RouteDef {
            route: Route::$route,
            method: $method,
            template: $template,
            op: Op::$op,
            metric: $metric,
            open: $open,
        },)*];
    };
}

routes! {
    CreateServiceRequest = "POST" "/serviceRequest/{workflow}", Create, "create_service_request_handler", false;
    GetServiceRequest = "GET" "/serviceRequest/{id}", Read, "get_service_request_handler_by_id", false;
    CancelServiceRequest = "POST" "/serviceRequest/{id}/cancel", Cancel, "cancel_service_request_handler", false;
    RetryServiceRequest = "POST" "/serviceRequest/{id}/retry", Retry, "clamp_retry_service_request_handler", false;
    RerunServiceRequest = "POST" "/serviceRequest/{id}/rerun", Rerun, "clamp_rerun_service_request_handler", false;
    ServiceRequestChildren = "GET" "/serviceRequest/{id}/children", Read, "clamp_service_request_children_handler", false;
    ServiceRequestNotifications = "GET" "/serviceRequest/{id}/notifications", Read, "clamp_service_request_notifications_handler", false;
    ListServiceRequests = "GET" "/serviceRequests/{workflow}", Read, "get_service_requests_by_workflow_name_handler", false;
    SearchServiceRequests = "GET" "/serviceRequests", Read, "clamp_search_service_requests_handler", false;
    RetryServiceRequests = "POST" "/serviceRequests/retry", BulkRetry, "clamp_retry_service_requests_handler", false;
    CountServiceRequests = "GET" "/serviceRequestCounts", Read, "clamp_count_service_requests_handler", false;
    CreateWorkflow = "POST" "/workflow", DefineWorkflow, "create_workflow_request_handler", false;
    GetWorkflow = "GET" "/workflow/{name}", Read, "get_workflow_handler_by_workflow_name", false;
    PutWorkflow = "PUT" "/workflow/{name}", DefineWorkflow, "clamp_put_workflow_handler", false;
    WorkflowVersions = "GET" "/workflow/{name}/versions", Read, "clamp_workflow_versions_handler", false;
    PauseWorkflow = "POST" "/workflow/{name}/pause", PauseWorkflow, "clamp_pause_workflow_handler", false;
    ResumeWorkflow = "POST" "/workflow/{name}/resume", ResumeWorkflow, "clamp_resume_workflow_handler", false;
    ListWorkflows = "GET" "/workflows", Read, "get_workflows_handler", false;
    StepResponse = "POST" "/stepResponse", StepResponse, "resume_async_service_request_handler", false;
    DeliverEvent = "POST" "/events/{event}", DeliverEvent, "clamp_deliver_event_handler", false;
    CreateSchedule = "POST" "/schedules", ChangeSchedule, "clamp_create_schedule_handler", false;
    ListSchedules = "GET" "/schedules", Read, "clamp_list_schedules_handler", false;
    GetSchedule = "GET" "/schedules/{name}", Read, "clamp_get_schedule_handler", false;
    PutSchedule = "PUT" "/schedules/{name}", ChangeSchedule, "clamp_put_schedule_handler", false;
    DeleteSchedule = "DELETE" "/schedules/{name}", ChangeSchedule, "clamp_delete_schedule_handler", false;
    TriggerSchedule = "POST" "/schedules/{name}/trigger", ChangeSchedule, "clamp_trigger_schedule_handler", false;
    PauseSchedule = "POST" "/schedules/{name}/pause", ChangeSchedule, "clamp_pause_schedule_handler", false;
    ResumeSchedule = "POST" "/schedules/{name}/resume", ChangeSchedule, "clamp_resume_schedule_handler", false;
    CreateTrigger = "POST" "/triggers", ChangeTrigger, "clamp_create_trigger_handler", false;
    ListTriggers = "GET" "/triggers", Read, "clamp_list_triggers_handler", false;
    GetTrigger = "GET" "/triggers/{name}", Read, "clamp_get_trigger_handler", false;
    PutTrigger = "PUT" "/triggers/{name}", ChangeTrigger, "clamp_put_trigger_handler", false;
    DeleteTrigger = "DELETE" "/triggers/{name}", ChangeTrigger, "clamp_delete_trigger_handler", false;
    PauseTrigger = "POST" "/triggers/{name}/pause", ChangeTrigger, "clamp_pause_trigger_handler", false;
    ResumeTrigger = "POST" "/triggers/{name}/resume", ChangeTrigger, "clamp_resume_trigger_handler", false;
    Hook = "POST" "/hooks/{name}", Hook, "clamp_hook_handler", true;
    Audit = "GET" "/audit", ReadAudit, "clamp_audit_handler", false;
    Health = "GET" "/health", Read, "health_handler", true;
    Ready = "GET" "/ready", Read, "ready_handler", true;
    Metrics = "GET" "/metrics", Read, "metrics_handler", false;
    OpenApi = "GET" "/openapi.json", Read, "openapi_handler", false;
    Console = "" "/console", Read, "clamp_console_handler", false;
    NotFound = "" "", Read, "not_found_handler", false;
}

impl Route {
    /// Its row.
    pub fn def(self) -> &'static RouteDef {
        &ROUTES[self as usize]
    }

    /// Its path template, for span names and `http.route`.
    pub fn template(self) -> &'static str {
        self.def().template
    }

    /// The operation it carries.
    pub fn op(self) -> Op {
        self.def().op
    }

    /// Its metric name prefix.
    pub fn metric_prefix(self) -> &'static str {
        self.def().metric
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_row_is_its_routes_and_no_two_rows_answer_the_same_call() {
        for (i, def) in ROUTES.iter().enumerate() {
            assert_eq!(def.route as usize, i);
            assert_eq!(def.route.def().template, def.template);
        }
        let routed: Vec<&RouteDef> = ROUTES.iter().filter(|d| !d.method.is_empty()).collect();
        for (i, a) in routed.iter().enumerate() {
            for b in &routed[i + 1..] {
                assert!(
                    !(a.method == b.method && a.template == b.template),
                    "{} {} twice",
                    a.method,
                    a.template
                );
            }
            assert!(a.template.starts_with('/'), "{}", a.template);
        }
        let metrics: std::collections::HashSet<&str> = ROUTES.iter().map(|d| d.metric).collect();
        assert_eq!(metrics.len(), ROUTES.len(), "a metric name per route");
    }
}
