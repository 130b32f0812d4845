//! Dispatch: which manager runs a step, and in which order managers refine the inventory.

use crate::{HardwareManager, StepContext, StepError, SupportLevel};
use rivet_protocol::inventory::Inventory;
use rivet_protocol::steps::StepDescriptor;
use serde_json::{Map, Value};
use std::sync::Arc;

/// The managers that support this machine, with their evaluated support levels.
pub struct Dispatcher {
    /// Sorted by support level, highest first; ties keep registration order.
    managers: Vec<(SupportLevel, Arc<dyn HardwareManager>)>,
}

impl Dispatcher {
    /// Evaluate every manager once and keep those with support above `None`.
    pub fn new(managers: Vec<Arc<dyn HardwareManager>>) -> Self {
        let mut managers: Vec<_> = managers
            .into_iter()
            .map(|m| (m.evaluate_support(), m))
            .filter(|(level, _)| *level > SupportLevel::None)
            .collect();
        // Stable sort: equal levels keep registration order, so the first registered wins.
        managers.sort_by_key(|m| std::cmp::Reverse(m.0));
        Dispatcher { managers }
    }

    /// Names and support levels, highest first.
    pub fn managers(&self) -> impl Iterator<Item = (&str, SupportLevel)> {
        self.managers.iter().map(|(l, m)| (m.name(), *l))
    }

    /// The manager that runs `step`: the highest support level that offers it, as a clean
    /// step or else as a deploy step.
    fn owner(&self, step: &str) -> Option<(&Arc<dyn HardwareManager>, StepDescriptor)> {
        let find = |deploy: bool| {
            self.managers.iter().find_map(|(_, m)| {
                let offered = if deploy { m.deploy_steps() } else { m.steps() };
                offered.into_iter().find(|s| s.step == step).map(|s| (m, s))
            })
        };
        find(false).or_else(|| find(true))
    }

    /// Every clean step offered, one per name (the owner's descriptor), in priority order.
    pub fn steps(&self) -> Vec<StepDescriptor> {
        Self::merged(self.managers.iter().map(|(_, m)| m.steps()))
    }

    /// Every deploy step offered, one per name (the owner's descriptor), in priority order.
    pub fn deploy_steps(&self) -> Vec<StepDescriptor> {
        Self::merged(self.managers.iter().map(|(_, m)| m.deploy_steps()))
    }

    /// One descriptor per name, the first manager's (highest support), by priority.
    fn merged(per_manager: impl Iterator<Item = Vec<StepDescriptor>>) -> Vec<StepDescriptor> {
        let mut out: Vec<StepDescriptor> = Vec::new();
        for steps in per_manager {
            for s in steps {
                if !out.iter().any(|o| o.step == s.step) {
                    out.push(s);
                }
            }
        }
        out.sort_by(|a, b| b.priority.cmp(&a.priority).then(a.step.cmp(&b.step)));
        out
    }

    /// Descriptor of `step` as its owner offers it.
    pub fn step(&self, step: &str) -> Option<StepDescriptor> {
        self.owner(step).map(|(_, d)| d)
    }

    /// Run `step` on its owner, after checking required arguments.
    pub fn execute(
        &self,
        step: &str,
        args: &Map<String, Value>,
        ctx: &StepContext,
    ) -> Result<Value, StepError> {
        let (manager, desc) = self
            .owner(step)
            .ok_or_else(|| StepError::UnknownStep(step.to_string()))?;
        for (name, info) in &desc.argsinfo {
            if info.required && !args.contains_key(name) {
                return Err(StepError::BadArgument {
                    name: name.clone(),
                    reason: "required argument missing".into(),
                });
            }
        }
        tracing::info!(step, manager = manager.name(), "running step");
        manager.execute(step, args, ctx)
    }

    /// Let every manager refine the inventory, lowest support level first so the most
    /// specific manager has the last word.
    pub fn inventory(&self, inventory: &mut Inventory) {
        for (_, m) in self.managers.iter().rev() {
            m.inventory(inventory);
        }
    }

    /// Manager name → version.
    pub fn versions(&self) -> Map<String, Value> {
        self.managers
            .iter()
            .map(|(_, m)| (m.name().to_string(), Value::from(m.version())))
            .collect()
    }
}
