"""Old (HEAD) and new packed_unroll, eager on the CPU, alternated in one process: seconds per forward+backward."""
import importlib, sys, time, statistics, torch
def load(root):
    for m in [k for k in sys.modules if k.startswith("draftlab")]:
        del sys.modules[m]
    sys.path.insert(0, root)
    pk = importlib.import_module("draftlab.train.packed"); dr = importlib.import_module("draftlab.model.draft")
    sys.path.remove(root)
    return pk, dr
B, T, steps, V, VD, H = 4, 512, 7, 49152, 8192, 576
g = torch.Generator().manual_seed(0)
att = torch.ones(B, T, dtype=torch.bool)
loss_mask = att & (torch.arange(T)[None] >= int(0.4 * T))
batch = {"input_ids": torch.randint(0, V, (B, T), generator=g), "features": torch.randn(B, T, 3 * H, generator=g),
         "last_hidden": torch.randn(B, T, H, generator=g), "loss_mask": loss_mask, "attention_mask": att,
         "target_top": torch.randint(0, V, (B, T), generator=g)}
lm_head = torch.randn(V, H, generator=g) * 0.02
mods = {n: load(r) for n, r in (("old", "/tmp/oldsrc/src"), ("new", "/work/main/src"))}
models = {}
for n, (pk, dr) in mods.items():
    torch.manual_seed(0)
    cfg = dr.DraftModelConfig(hidden_size=H, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
                              head_dim=64, target_hidden_size=H, aux_layer_ids=[1, 14, 26], vocab_size=V,
                              draft_vocab_size=VD, num_hidden_layers=1)
    m = dr.Eagle3Draft(cfg)
    used = torch.arange(VD) * 6
    t2d = torch.zeros(V, dtype=torch.bool); t2d[used] = True
    m.init_from_target(lm_head.clone(), None, used - torch.arange(VD), t2d)
    models[n] = m
plan = mods["new"][0].PackedPlan.of(loss_mask, att, steps)
times = {"old": [], "new": []}
for i in range(int(sys.argv[1])):
    for n in (("old", "new") if i % 2 == 0 else ("new", "old")):
        pk, _ = mods[n]; m = models[n]
        m.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        loss, stats = pk.packed_unroll(m, batch, lm_head, steps, 0.8, plan=plan)
        loss.backward()
        times[n].append(time.perf_counter() - t0)
for n, t in times.items():
    print(n, "median %.3f s" % statistics.median(t[1:]), " ".join("%.2f" % x for x in t))
