//! The `control` driver: control-socket messages run against a service
//! with a few devices; and its seed sessions.

use std::sync::Arc;

use crate::nbd::ExportSet;

/// A control service with a few devices to act on, built once and reused
/// for every input (as a server's is for every client).
pub struct ControlHarness {
    service: crate::control::service::Service,
}

impl ControlHarness {
    pub fn new() -> ControlHarness {
        use crate::mapper::{BuildOptions, Devices};
        use crate::nbd::export::BudgetPolicy;
        let devices = Arc::new(Devices::new(BuildOptions::default(), true, false));
        let engine = Arc::new(crate::engine::Engine::start(1).expect("engine"));
        let exports = Arc::new(ExportSet::new(
            engine,
            BudgetPolicy {
                total: Some(8 << 20),
                exports: 4,
            },
        ));
        ControlHarness {
            service: crate::control::service::Service::new(devices, exports, false),
        }
    }

    /// Read messages from `data` as the control server does and run each.
    /// Tables that name a path are refused here (a fuzzer must not open
    /// the machine's files); `@NAME`, `zero` and `error` tables run.
    pub fn run(&self, data: &[u8]) -> usize {
        use crate::control::proto::{read_message, Request};
        let mut r = std::io::Cursor::new(data);
        let mut ran = 0;
        for _ in 0..32 {
            let Ok(msg) = read_message(&mut r, || {}) else {
                break;
            };
            let Ok(req) = serde_json::from_slice::<Request>(&msg.json) else {
                continue;
            };
            if msg.payload.contains(&b'/') || req.op == "wait" {
                continue;
            }
            let _ = self.service.handle(&req, msg.payload, &|| false);
            ran += 1;
        }
        ran
    }
}

impl Default for ControlHarness {
    fn default() -> Self {
        Self::new()
    }
}

static CONTROL: std::sync::OnceLock<ControlHarness> = std::sync::OnceLock::new();

/// The `control` fuzz target: a stream of control messages (header, JSON
/// request, payload) against one long-lived service; never a panic.
pub fn control(data: &[u8]) -> usize {
    CONTROL.get_or_init(ControlHarness::new).run(data)
}

fn control_msg(json: serde_json::Value, payload: &str) -> Vec<u8> {
    let j = serde_json::to_vec(&json).expect("json");
    let mut v = Vec::new();
    crate::control::proto::write_message(&mut v, &j, payload.as_bytes()).expect("vec");
    v
}

/// Seed control sessions: create, reload, suspend/resume, status,
/// messages to the fault targets, remove.
pub fn control_seeds() -> Vec<(&'static str, Vec<u8>)> {
    use serde_json::json;
    let mut life = Vec::new();
    for (j, p) in [
        (
            json!({"v":1,"op":"create","names":["z"],"has_table":true}),
            "0 8192 zero\n",
        ),
        (
            json!({"v":1,"op":"create","names":["l"],"has_table":true}),
            "0 4096 linear @z 0\n",
        ),
        (
            json!({"v":1,"op":"reload","names":["l"]}),
            "0 8192 linear @z 0\n",
        ),
        (json!({"v":1,"op":"suspend","names":["l"]}), ""),
        (json!({"v":1,"op":"resume","names":["l"]}), ""),
        (json!({"v":1,"op":"status","names":["l"]}), ""),
        (json!({"v":1,"op":"table","names":[]}), ""),
        (json!({"v":1,"op":"remove","names":["l"]}), ""),
        (json!({"v":1,"op":"remove","names":["z"]}), ""),
    ] {
        life.extend(control_msg(j, p));
    }
    let mut dust = Vec::new();
    for (j, p) in [
        (
            json!({"v":1,"op":"create","names":["z2"],"has_table":true}),
            "0 8192 zero\n",
        ),
        (
            json!({"v":1,"op":"create","names":["d"],"has_table":true}),
            "0 8192 dust @z2 0 512\n",
        ),
        (
            json!({"v":1,"op":"message","names":["d"],"sector":0,"message":["addbadblock","7"]}),
            "",
        ),
        (
            json!({"v":1,"op":"message","names":["d"],"sector":0,"message":["enable"]}),
            "",
        ),
        (
            json!({"v":1,"op":"message","names":["d"],"sector":0,"message":["listbadblocks"]}),
            "",
        ),
        (json!({"v":1,"op":"status","names":["d"]}), ""),
        (json!({"v":1,"op":"remove","names":["d"],"force":true}), ""),
        (json!({"v":1,"op":"remove","names":["z2"]}), ""),
    ] {
        dust.extend(control_msg(j, p));
    }
    let mut flakey = Vec::new();
    for (j, p) in [
        (
            json!({"v":1,"op":"create","names":["z3"],"has_table":true}),
            "0 8192 zero\n",
        ),
        (
            json!({"v":1,"op":"create","names":["f"],"has_table":true}),
            "0 8192 flakey @z3 0 1 1 1 drop_writes\n",
        ),
        (
            json!({"v":1,"op":"create","names":["lw"],"has_table":true}),
            "0 4096 log-writes @z3 @f\n",
        ),
        (
            json!({"v":1,"op":"message","names":["lw"],"sector":0,"message":["mark","m"]}),
            "",
        ),
        (json!({"v":1,"op":"ls"}), ""),
        (json!({"v":1,"op":"remove_all","force":true}), ""),
    ] {
        flakey.extend(control_msg(j, p));
    }
    vec![
        ("version", control_msg(json!({"v":1,"op":"version"}), "")),
        ("targets", control_msg(json!({"v":1,"op":"targets"}), "")),
        ("lifecycle", life),
        ("dust_messages", dust),
        ("flakey_log_writes", flakey),
    ]
}
