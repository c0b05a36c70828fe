//! What a `DataParallel` saves and loads: the whole model and optimizer state under PyTorch's
//! names, gathered from the owners (ZeRO-1) or the shards (ZeRO-2/3) and cut again on load, so
//! that a checkpoint of a sharded run loads into a plain one, and one of a plain run into a
//! sharded one of any device count.
use super::{gather, shard, update, DataParallel, Shard};
use crate::{Device, Error, Result, Tensor};
use std::collections::{HashMap, HashSet};

impl DataParallel {
    /// Runs `f` with every replica's full parameters present: under ZeRO-3 gathered before
    /// and released after (a collective across processes: every rank calls it).
    pub(super) fn with_full<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let Some(s) = self.sharded.as_ref().filter(|s| s.mode == Shard::Full && !self.full_kept) else { return f() };
        s.gather(&self.replicas, &*self.comm)?;
        let out = f();
        s.release(&self.replicas)?;
        out
    }

    /// `f`, a forward on replica 0, with its parameters present: under ZeRO-3 in one process
    /// gathered unit by unit as its ops need them (the whole model need not fit the device),
    /// across processes the whole model gathered (a collective: every rank calls it).
    pub(super) fn on_replica_0<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        match self.sharded.as_ref().filter(|s| s.mode == Shard::Full && !self.full_kept) {
            Some(s) if self.comm.device_span().1 == self.replicas.len() => gather::on_first_device(s, &self.replicas, f),
            _ => self.with_full(f),
        }
    }

    /// The weights to save: replica 0's state_dict.
    pub(super) fn weights(&self) -> Result<Vec<(String, Tensor)>> {
        // The module's own state_dict: a model may name more than its parameters (Gpt's tied
        // `lm_head.weight`); replica 0's tensors are current after every step. Under ZeRO-3
        // they are gathered unit by unit onto the host (a CPU device of its own, outside any
        // device's budget): the whole model need not fit one device.
        if let Some(s) = self.sharded.as_ref().filter(|s| s.mode == Shard::Full) {
            if self.full_kept {
                return self.replicas[0].model.state_dict().into_iter().map(|(k, t)| Ok((k, shard::copy_of(&t)?))).collect();
            }
            let host = Device::cpu_independent();
            let full = s.gather_to_host(&self.replicas, &*self.comm, &host)?;
            return self.replicas[0]
                .model
                .state_dict()
                .into_iter()
                .map(|(k, t)| match full.get(&t.id()) {
                    Some(p) => Ok((k, p.clone())),
                    // Not a parameter (a running statistic): never released.
                    None => Ok((k, shard::copy_of(&t)?.to(&host)?)),
                })
                .collect();
        }
        Ok(self.replicas[0].model.state_dict())
    }

    /// Every replica loads `state`; under ZeRO-2/3 each device then cuts its shard from it.
    /// ZeRO-3 cuts its pieces straight from `state` instead, never holding a whole model.
    pub(super) fn load_weights(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        let Some(s) = &self.sharded else { return self.replicas.iter().try_for_each(|r| r.model.load_state_dict(state)) };
        if s.mode == Shard::Full && !self.full_kept {
            return self.load_into_pieces(s, state);
        }
        for r in &self.replicas {
            r.params.iter().try_for_each(|(_, t)| t.restore_storage().map(drop))?;
            r.model.load_state_dict(state)?;
        }
        s.refresh(&self.replicas)?;
        if s.mode == Shard::Full && !self.full_kept {
            s.release(&self.replicas)?;
        }
        Ok(())
    }
    /// ZeRO-3's strict load: every parameter named in `state` with its shape, no name the model
    /// does not have; the pieces cut from it, and what the model holds besides its parameters
    /// (running statistics; a tied name is its parameter) assigned on every replica.
    fn load_into_pieces(&self, s: &shard::Sharded, state: &[(String, Tensor)]) -> Result<()> {
        const OP: &str = "DataParallel::load_state_dict";
        let by_name: HashMap<&str, &Tensor> = state.iter().map(|(k, t)| (k.as_str(), t)).collect();
        let r0 = &self.replicas[0];
        for (name, t) in &r0.params {
            match by_name.get(name.as_str()) {
                None => return Err(Error::invalid(OP, format!("the state has no {name}"))),
                Some(v) if v.shape() != t.shape() => {
                    return Err(Error::shape(OP, format!("{name} is {:?} in the state, {:?} in the model", v.shape(), t.shape())))
                }
                Some(_) => {}
            }
        }
        let known: HashSet<String> = r0.model.state_dict().into_iter().map(|(k, _)| k).collect();
        if let Some((k, _)) = state.iter().find(|(k, _)| !known.contains(k)) {
            return Err(Error::invalid(OP, format!("the state has {k}, which the model does not")));
        }
        for r in &self.replicas {
            for (k, t) in r.model.state_dict() {
                match by_name.get(k.as_str()) {
                    Some(v) if !r.index_of.contains_key(&t.id()) => t.assign(v)?,
                    _ => {}
                }
            }
        }
        s.load_pieces(&by_name)
    }

    /// The optimizer state to save: replica 0's; where parameters have owners, each parameter's state gathered from
    /// its owner onto device 0, in state_dict order (across processes a collective: owners on
    /// other ranks send theirs).
    pub(super) fn whole_optimizer_state(&self) -> Result<(Vec<(String, Tensor)>, u64)> {
        let (first, steps) = self.opts[0].state();
        if let Some(s) = &self.sharded {
            let mine: Vec<Vec<(String, Tensor)>> = self.opts.iter().map(|o| o.state().0).collect();
            let all = match self.comm.process_group().filter(|g| g.size() > 1) {
                // Every rank's pieces in rank order, each rank's devices in order: global
                // device order, which is the order of the pieces along each parameter.
                Some(group) => vec![group.all_gather_named(&mine.concat())?],
                None => mine,
            };
            return Ok((s.full_state(&all, &self.replicas, &Device::cpu_independent())?, steps));
        }
        let Some(owners) = &self.owners else { return Ok((first, steps)) };
        if let Some(group) = self.comm.process_group().filter(|g| g.size() > 1) {
            let mine: Vec<(String, Tensor)> = self.opts.iter().flat_map(|o| o.state().0).collect();
            return Ok((update::gathered_state(&group.all_gather_named(&mine)?, &self.replicas[0])?, steps));
        }
        let states: Vec<Vec<(String, Tensor)>> = self.opts.iter().map(|o| o.state().0).collect();
        let dev0 = &self.replicas[0].device;
        let mut out = Vec::new();
        for (p, (name, _)) in self.replicas[0].params.iter().enumerate() {
            let prefix = format!("{name}.");
            for (key, t) in states[owners[p]].iter().filter(|(k, _)| k.starts_with(&prefix)) {
                let t = if owners[p] == 0 { t.clone() } else { self.comm.send_recv(t, dev0)? };
                out.push((key.clone(), t));
            }
        }
        Ok((out, steps))
    }

    /// Every replica loads `state`; where parameters have owners each keeps only its own
    /// parameters' entries, under ZeRO-2/3 only its pieces of them.
    pub(super) fn load_whole_optimizer_state(&mut self, state: &[(String, Tensor)], steps: u64) -> Result<()> {
        self.run.step = steps;
        if let Some(s) = &self.sharded {
            for (i, (o, r)) in self.opts.iter_mut().zip(&self.replicas).enumerate() {
                o.load_state(&s.state_piece(i, state, r)?, steps)?;
            }
            return Ok(());
        }
        self.opts.iter_mut().try_for_each(|o| o.load_state(state, steps))
    }
}
