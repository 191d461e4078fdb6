//! dm-stats regions over the control socket (`dmstats create`, `delete`,
//! `list`, `report`): the counters live in each device's `dm::Stats`;
//! here the verbs' words are read and checked against the device.
//!
//! The request reuses `message` for its words, so the protocol's request
//! shape is unchanged: `stats_create` takes `[start, length, area, program
//! id]` in sectors (length 0: to the device's end; area `count:N`,
//! `size:N` or `whole`), `stats_delete` takes `[ID]` or `[all]`.

use serde_json::{json, Value};

use super::proto::{Code, OpError, Request};
use crate::mapper::DevInfo;

fn einval(msg: impl Into<String>) -> OpError {
    OpError::new(Code::Einval, msg)
}

fn word(req: &Request, i: usize, what: &str) -> Result<String, OpError> {
    req.message
        .get(i)
        .cloned()
        .ok_or_else(|| einval(format!("{}: the {what} is missing", req.op)))
}

fn sectors(req: &Request, i: usize, what: &str) -> Result<u64, OpError> {
    let w = word(req, i, what)?;
    w.parse()
        .map_err(|_| einval(format!("{}: the {what} must be sectors, got '{w}'", req.op)))
}

/// Run a region verb on the selected devices.
pub(super) fn run(req: &Request, devs: &[DevInfo]) -> Result<Value, OpError> {
    match req.op.as_str() {
        "stats_create" => create(req, devs),
        "stats_delete" => delete(req, devs),
        _ => Ok(list(devs)),
    }
}

fn create(req: &Request, devs: &[DevInfo]) -> Result<Value, OpError> {
    let start = sectors(req, 0, "start")?;
    let len = sectors(req, 1, "length")?;
    let area = word(req, 2, "area")?;
    let program = word(req, 3, "program id")?;
    let mut out = Vec::new();
    for d in devs {
        let size = d.size >> 9;
        let len = if len == 0 {
            size.saturating_sub(start)
        } else {
            len
        };
        if start.saturating_add(len) > size || len == 0 {
            return Err(einval(format!(
                "{}: the region {start}+{len} does not fit the device's {size} sectors",
                d.name
            )));
        }
        let area_len = match area.split_once(':') {
            Some(("count", n)) => {
                let n: u64 =
                    n.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                        einval(format!("--areas needs a positive count, got '{n}'"))
                    })?;
                len.div_ceil(n)
            }
            Some(("size", n)) => n
                .parse()
                .map_err(|_| einval(format!("--areasize needs sectors, got '{n}'")))?,
            _ => 0,
        };
        let id = d
            .device
            .stats()
            .create_region(start << 9, len << 9, area_len << 9, &program)
            .map_err(|e| einval(format!("{}: {e}", d.name)))?;
        let areas = if area_len == 0 {
            1
        } else {
            len.div_ceil(area_len)
        };
        out.push(json!({ "name": d.name, "id": id, "areas": areas }));
    }
    Ok(json!({ "created": out }))
}

fn delete(req: &Request, devs: &[DevInfo]) -> Result<Value, OpError> {
    let which = word(req, 0, "region id")?;
    let id = match which.as_str() {
        "all" => None,
        n => Some(
            n.parse::<u64>()
                .map_err(|_| einval(format!("--regionid needs a whole number, got '{n}'")))?,
        ),
    };
    for d in devs {
        if !d.device.stats().delete_region(id) && id.is_some() {
            return Err(OpError::new(
                Code::Enxio,
                format!("{}: no region {which} ('dmstats list' shows them)", d.name),
            ));
        }
    }
    Ok(json!({}))
}

fn list(devs: &[DevInfo]) -> Value {
    let out: Vec<Value> = devs
        .iter()
        .map(|d| json!({ "name": d.name, "regions": d.device.stats().regions() }))
        .collect();
    json!({ "devices": out })
}
