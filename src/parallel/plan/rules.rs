//! Megatron-LM's rule of thumb (tensor parallelism inside a server, pipeline stages and data
//! parallelism across servers) held against a plan: whether the plan agrees, and when it
//! departs, what the rule's best layout would cost instead.
use super::{Cluster, Estimate, Layout, Plan};

impl Plan {
    /// One sentence: does [`Plan::best`] follow Megatron-LM's rule on `cluster` (the cluster
    /// planned for), and if not, why not in the cost model's figures.
    pub fn megatron(&self, cluster: &Cluster) -> String {
        let mut sorted = cluster.clone();
        sorted.devices.sort_by(|a, b| b.speed.total_cmp(&a.speed));
        let server = |i: usize| sorted.devices[i].server;
        let within =
            |l: &Layout| (0..l.data).all(|r| (0..l.pipeline).all(|s| (0..l.tensor).all(|t| server(l.device(r, s, t)) == server(l.device(r, s, 0)))));
        let l = &self.best.layout;
        let ms = |e: &Estimate| format!("{:.1} ms", e.step_s * 1e3);
        let best_tensor = self.alternatives.iter().find(|e| e.layout.tensor > 1 && within(&e.layout));
        if !within(l) {
            return format!("departs from Megatron-LM's rule: a tensor group of {l} spans servers");
        }
        match (l.tensor, l.pipeline) {
            (1, 1) => {
                let other = best_tensor
                    .map_or(String::new(), |e| format!("; the best with tensor parallelism inside servers, {}, is predicted {}", e.layout, ms(e)));
                format!("agrees with Megatron-LM's rule: the model fits one device, where Megatron-LM too is data parallel only (tensor and pipeline parallelism only add communication){other}")
            }
            (t, 1) => format!("agrees with Megatron-LM's rule: tensor parallel over {t} devices inside a server, data parallel across"),
            (1, _) => {
                let other = best_tensor.map_or("no layout with tensor parallelism fits".to_string(), |e| {
                    format!("the best with tensor parallelism inside servers, {}, is predicted {} against {}", e.layout, ms(e), ms(&self.best))
                });
                format!("departs from Megatron-LM's rule: pipeline stages without tensor parallelism ({other})")
            }
            (t, p) => {
                let stages_across = (0..l.data).all(|r| (1..p).all(|s| server(l.device(r, s, 0)) != server(l.device(r, s - 1, 0))));
                if stages_across {
                    format!("agrees with Megatron-LM's rule: tensor parallel over {t} devices inside a server, {p} pipeline stages across servers")
                } else {
                    format!("agrees with Megatron-LM's rule on tensor parallelism ({t} devices inside a server); {p} pipeline stages share a server, as Megatron-LM also does once a server's devices outnumber the tensor degree")
                }
            }
        }
    }
}
