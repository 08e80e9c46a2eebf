//! `DefinitionStore` on the embedded store: metric and rule definitions, each with its version,
//! which a new fingerprint moves up and a deletion keeps.

use async_trait::async_trait;

use super::MemoryStore;
use super::persist::definition_change;
use crate::store::{
    Deadline, DefinitionKind, DefinitionStore, Invalidation, NewDefinition, StoreResult,
    StoredDefinition,
};

#[async_trait]
impl DefinitionStore for MemoryStore {
    async fn definitions(&self, kind: DefinitionKind) -> StoreResult<Vec<StoredDefinition>> {
        let st = self.lock();
        Ok(st
            .definitions
            .iter()
            .filter(|((k, _), (_, fp, _))| *k == kind.as_str() && !fp.is_empty())
            .map(|((_, id), (version, _, body))| StoredDefinition {
                id: id.clone(),
                version: *version,
                body: body.clone(),
            })
            .collect())
    }

    async fn definition(
        &self,
        kind: DefinitionKind,
        id: &str,
    ) -> StoreResult<Option<StoredDefinition>> {
        let st = self.lock();
        Ok(st
            .definitions
            .get(&(kind.as_str(), id.to_owned()))
            .filter(|(_, fp, _)| !fp.is_empty())
            .map(|(version, _, body)| StoredDefinition {
                id: id.to_owned(),
                version: *version,
                body: body.clone(),
            }))
    }

    async fn put_definition(&self, d: NewDefinition<'_>, _deadline: Deadline) -> StoreResult<u64> {
        let (version, pending) = {
            let mut st = self.lock();
            self.writable()?;
            let slot = st
                .definitions
                .entry((d.kind.as_str(), d.id.to_owned()))
                .or_insert((0, String::new(), String::new()));
            if slot.1.is_empty() || slot.1 != d.fingerprint {
                slot.0 += 1;
            }
            slot.1 = d.fingerprint.to_owned();
            slot.2 = d.body.to_owned();
            let row = definition_change(d.kind.as_str(), d.id, slot);
            (slot.0, self.record(vec![row]))
        };
        Self::durable(pending).await?;
        let _ = self
            .invalidations
            .send(Invalidation::definition(d.kind, d.id));
        Ok(version)
    }

    async fn delete_definition(
        &self,
        kind: DefinitionKind,
        id: &str,
        _deadline: Deadline,
    ) -> StoreResult<bool> {
        let existed = {
            let mut st = self.lock();
            self.writable()?;
            match st.definitions.get_mut(&(kind.as_str(), id.to_owned())) {
                Some(slot) if !slot.1.is_empty() => {
                    slot.1.clear();
                    slot.2.clear();
                    let row = definition_change(kind.as_str(), id, slot);
                    Some(self.record(vec![row]))
                }
                _ => None,
            }
        };
        let Some(pending) = existed else {
            return Ok(false);
        };
        Self::durable(pending).await?;
        let _ = self.invalidations.send(Invalidation::definition(kind, id));
        Ok(true)
    }
}
