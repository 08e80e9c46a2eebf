//! The definitions of metrics and rules: defined, changed and deleted through the store
//! (versioned there), reloaded into every instance on any instance's change.

use std::sync::Arc;

use super::{Velocity, VelocityError, Wanted, load, undefined_metric, undefined_rule};
use crate::domain::{ErrorCode, MetricId, RuleId, ValidationError};
use crate::metrics::StoreOp;
use crate::store::{Deadline, DefinitionKind, NewDefinition};
use crate::velocity::model::{MetricDef, MetricSpec, RuleDef};
use crate::velocity::rules;

impl Velocity {
    /// Reloads every definition from the store (kept as they were if it fails), or waits for
    /// a load that started after this call: one load at a time, and every caller that asked
    /// while it ran shares the next, so a slower, older load never overwrites a newer one. A
    /// failed load counts as done for those who shared it (they would have failed too). For
    /// what a single change cannot tell: start-up, a new subscription (what changed while
    /// nobody listened), the 30 s backstop and an older build's message; a change that names
    /// its definition is read alone (`refresh`).
    pub async fn reload(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        let asked = self.reloads.fetch_add(1, SeqCst) + 1;
        let mut loaded = self.loaded.lock().await;
        if *loaded >= asked {
            return;
        }
        // Every number given so far was given before this load starts reading.
        let upto = self.reloads.load(SeqCst);
        let deadline = Deadline::after(self.settings.write_deadline);
        match load(&self.definitions, deadline).await {
            Ok(d) => *self.defs.write().expect("definitions lock") = Arc::new(d),
            Err(e) => tracing::warn!(error = %e, "reloading definitions failed"),
        }
        *loaded = upto;
    }

    /// Reads these definitions again (after this instance's put or delete of one, or the
    /// messages naming them) and applies them to one copy of the loaded ones: an `HGET`
    /// each, not a load of them all, so a burst of changes costs every instance a read per
    /// change, not a parse of every definition per change. Under `reload`'s lock, so reads
    /// and loads apply in the order they read. A failed read leaves that definition as it
    /// was until the next load (at most 30 s: the subscription's backstop).
    pub(super) async fn refresh(&self, names: &[(DefinitionKind, &str)]) {
        let _one_at_a_time = self.loaded.lock().await;
        let deadline = Deadline::after(self.settings.write_deadline);
        let mut d = (*self.defs()).clone();
        for &(kind, id) in names {
            let read = self
                .definitions
                .call(StoreOp::Definitions, deadline, |s| s.definition(kind, id))
                .await;
            match read {
                Ok(stored) => d.apply(kind, id, stored),
                Err(e) => tracing::warn!(error = %e, "reading a changed definition failed"),
            }
        }
        *self.defs.write().expect("definitions lock") = Arc::new(d);
    }

    /// Reads what change messages asked for (`Wanted`).
    pub(super) async fn catch_up(&self, wanted: Wanted) {
        match wanted {
            Wanted::All => self.reload().await,
            Wanted::These(these) => {
                let names: Vec<_> = these.iter().map(|(k, id)| (*k, id.as_str())).collect();
                self.refresh(&names).await;
            }
        }
    }

    // ---- definitions ----

    /// Stores a definition (its `fingerprint` tells a change from the same one again) and
    /// reads it back into this instance's; its version.
    async fn store_definition(&self, definition: NewDefinition<'_>) -> Result<u64, VelocityError> {
        let deadline = Deadline::after(self.settings.write_deadline);
        let version = self
            .definitions
            .call(StoreOp::Define, deadline, |s| {
                s.put_definition(definition, deadline)
            })
            .await?;
        self.refresh(&[(definition.kind, definition.id)]).await;
        Ok(version)
    }

    /// Deletes a definition and reads it back (gone); `missing()` if there was none.
    async fn drop_definition(
        &self,
        kind: DefinitionKind,
        id: &str,
        missing: impl FnOnce() -> VelocityError,
    ) -> Result<(), VelocityError> {
        let deadline = Deadline::after(self.settings.write_deadline);
        let existed = self
            .definitions
            .call(StoreOp::Define, deadline, |s| {
                s.delete_definition(kind, id, deadline)
            })
            .await?;
        self.refresh(&[(kind, id)]).await;
        if existed { Ok(()) } else { Err(missing()) }
    }

    /// Defines (or redefines) a metric. The same definition keeps its version.
    pub async fn put_metric(
        &self,
        id: MetricId,
        expr: &str,
        resolution: Option<&str>,
    ) -> Result<MetricDef, VelocityError> {
        let spec = MetricSpec::parse(expr, resolution)?;
        self.room_for_metric(&id, &spec)?;
        let body = serde_json::to_string(&spec).expect("a spec serialises");
        let version = self
            .store_definition(NewDefinition {
                kind: DefinitionKind::Metric,
                id: id.as_str(),
                fingerprint: &spec.fingerprint(),
                body: &body,
            })
            .await?;
        tracing::info!(metric = %id, version, "metric defined");
        Ok(MetricDef { id, version, spec })
    }

    /// Refuses a new metric past `max_definitions`, and one that would be its event type's
    /// metric past `max_metrics_per_event` (see `DefinitionLimits`). A change of an existing
    /// metric that keeps its event type is always allowed.
    fn room_for_metric(&self, id: &MetricId, spec: &MetricSpec) -> Result<(), VelocityError> {
        let defs = self.defs();
        let limits = self.settings.limits;
        let known = defs.metrics.get(id);
        if known.is_none() && defs.metrics.len() >= limits.definitions {
            return Err(full(format!(
                "{} metrics are defined, at most {} (`max_definitions`): delete one first",
                defs.metrics.len(),
                limits.definitions
            )));
        }
        let feeding = defs.by_event.get(&spec.event).map_or(0, Vec::len);
        let joins = known.is_none_or(|d| d.spec.event != spec.event);
        if joins && feeding >= limits.metrics_per_event {
            return Err(full(format!(
                "event type {} already feeds {feeding} metrics, at most {} \
                 (`max_metrics_per_event`): delete one first",
                spec.event, limits.metrics_per_event
            )));
        }
        Ok(())
    }

    pub fn metric(&self, id: &MetricId) -> Result<MetricDef, VelocityError> {
        self.defs()
            .metrics
            .get(id)
            .map(|d| (**d).clone())
            .ok_or_else(|| unknown_metric(id))
    }

    pub fn list_metrics(&self) -> Vec<MetricDef> {
        self.defs()
            .metrics
            .values()
            .map(|d| (**d).clone())
            .collect()
    }

    /// Deletes a metric no rule reads.
    pub async fn delete_metric(&self, id: &MetricId) -> Result<(), VelocityError> {
        let deadline = Deadline::after(self.settings.write_deadline);
        // One read says whether there is anything to delete, before the rules are read:
        // deletes of metrics that do not exist cost one `HGET` each, not a read of every rule.
        let known = self
            .definitions
            .call(StoreOp::Definitions, deadline, |s| {
                s.definition(DefinitionKind::Metric, id.as_str())
            })
            .await?;
        if known.is_none() {
            return Err(unknown_metric(id));
        }
        // The rules as they are now, not as last heard (the metrics are not read).
        let rules = self
            .definitions
            .call(StoreOp::Definitions, deadline, |s| {
                s.definitions(DefinitionKind::Rule)
            })
            .await?;
        let users: Vec<String> = rules
            .into_iter()
            .filter_map(super::parse_rule)
            .filter(|r| r.0.metrics.contains(id))
            .map(|r| r.0.id.to_string())
            .collect();
        if !users.is_empty() {
            return Err(VelocityError::Conflict(ValidationError::new(
                ErrorCode::MetricInUse,
                format!(
                    "metric {id} is used by rules {}: delete or change them first",
                    users.join(", ")
                ),
            )));
        }
        self.drop_definition(DefinitionKind::Metric, id.as_str(), || unknown_metric(id))
            .await
    }

    /// Defines (or redefines) a rule; every metric it reads must exist.
    pub async fn put_rule(&self, id: RuleId, expr: &str) -> Result<RuleDef, VelocityError> {
        let rule = rules::parse(expr)?;
        // The metrics it reads as they are now, not as last heard.
        let named = rule.metrics();
        let names: Vec<_> = named
            .iter()
            .map(|m| (DefinitionKind::Metric, m.as_str()))
            .collect();
        self.refresh(&names).await;
        let defs = self.defs();
        let unknown: Vec<String> = rule
            .metrics()
            .into_iter()
            .filter(|m| !defs.metrics.contains_key(m))
            .map(|m| m.to_string())
            .collect();
        if !unknown.is_empty() {
            return Err(ValidationError::new(
                ErrorCode::UnknownMetric,
                format!("the rule reads undefined metrics: {}", unknown.join(", ")),
            )
            .into());
        }
        let most = self.settings.limits.definitions;
        if !defs.rules.contains_key(&id) && defs.rules.len() >= most {
            return Err(full(format!(
                "{} rules are defined, at most {most} (`max_definitions`): delete one first",
                defs.rules.len()
            )));
        }
        let expr = expr.trim().to_owned();
        let body = serde_json::json!({ "expr": expr }).to_string();
        let version = self
            .store_definition(NewDefinition {
                kind: DefinitionKind::Rule,
                id: id.as_str(),
                fingerprint: &expr,
                body: &body,
            })
            .await?;
        Ok(RuleDef {
            id,
            version,
            expr,
            metrics: rule.metrics().into_iter().collect(),
        })
    }

    pub fn rule(&self, id: &RuleId) -> Result<RuleDef, VelocityError> {
        self.defs()
            .rules
            .get(id)
            .map(|r| r.0.clone())
            .ok_or_else(|| unknown_rule(id))
    }

    pub fn list_rules(&self) -> Vec<RuleDef> {
        self.defs().rules.values().map(|r| r.0.clone()).collect()
    }

    pub async fn delete_rule(&self, id: &RuleId) -> Result<(), VelocityError> {
        self.drop_definition(DefinitionKind::Rule, id.as_str(), || unknown_rule(id))
            .await
    }
}

/// A definition past a limit (`DefinitionLimits`): a 409, nothing stored.
fn full(message: String) -> VelocityError {
    VelocityError::Conflict(ValidationError::new(ErrorCode::TooManyDefinitions, message))
}

fn unknown_metric(id: &MetricId) -> VelocityError {
    VelocityError::NotFound(undefined_metric(id))
}

fn unknown_rule(id: &RuleId) -> VelocityError {
    VelocityError::NotFound(undefined_rule(id))
}
