//! The definitions of metrics and rules: defined, changed and deleted through the store
//! (versioned there), reloaded into every instance on any instance's change.

use std::sync::Arc;

use super::{Velocity, VelocityError, load, undefined_metric, undefined_rule};
use crate::domain::{ErrorCode, MetricId, RuleId, ValidationError};
use crate::metrics::StoreOp;
use crate::store::{Deadline, DefinitionKind, NewDefinition};
use crate::velocity::model::{MetricDef, MetricSpec, RuleDef};
use crate::velocity::rules;

impl Velocity {
    /// Reloads the definitions from the store (kept as they were if it fails).
    pub async fn reload(&self) {
        let this = self
            .reloads
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            + 1;
        let deadline = Deadline::after(self.settings.write_deadline);
        match load(&self.definitions, deadline).await {
            Ok(d) => {
                let mut applied = self.applied_reload.lock().expect("reload lock");
                if this > *applied {
                    *applied = this;
                    *self.defs.write().expect("definitions lock") = Arc::new(d);
                }
            }
            Err(e) => tracing::warn!(error = %e, "reloading definitions failed"),
        }
    }

    // ---- definitions ----

    /// Stores a definition (its `fingerprint` tells a change from the same one again) and
    /// reloads; its version.
    async fn store_definition(&self, definition: NewDefinition<'_>) -> Result<u64, VelocityError> {
        let deadline = Deadline::after(self.settings.write_deadline);
        let version = self
            .definitions
            .call(StoreOp::Define, deadline, |s| {
                s.put_definition(definition, deadline)
            })
            .await?;
        self.reload().await;
        Ok(version)
    }

    /// Deletes a definition and reloads; `missing()` if there was none.
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
        self.reload().await;
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
        self.reload().await;
        let users: Vec<String> = self
            .defs()
            .rules
            .values()
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
        self.reload().await;
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

fn unknown_metric(id: &MetricId) -> VelocityError {
    VelocityError::NotFound(undefined_metric(id))
}

fn unknown_rule(id: &RuleId) -> VelocityError {
    VelocityError::NotFound(undefined_rule(id))
}
