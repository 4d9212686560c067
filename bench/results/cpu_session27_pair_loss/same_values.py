"""Old (HEAD) and new (working tree) packed_core on one batch: loss, stats and every gradient, bit for bit?"""
import importlib, sys, torch
def load(root):
    for m in [k for k in sys.modules if k.startswith("draftlab")]:
        del sys.modules[m]
    sys.path.insert(0, root)
    pk = importlib.import_module("draftlab.train.packed")
    dr = importlib.import_module("draftlab.model.draft")
    sys.path.remove(root)
    return pk, dr
B, T, steps, V, VD = 6, 200, 7, 4096, 1024
g = torch.Generator().manual_seed(0)
lengths = torch.randint(T // 3, T + 1, (B,), generator=g)
att = torch.arange(T)[None] < lengths[:, None]
loss_mask = att & (torch.arange(T)[None] >= (lengths.float() * 0.4).long()[:, None])
batch = {"input_ids": torch.randint(0, V, (B, T), generator=g), "features": torch.randn(B, T, 3 * 64, generator=g),
         "last_hidden": torch.randn(B, T, 64, generator=g), "loss_mask": loss_mask, "attention_mask": att}
lm_head = torch.randn(V, 64, generator=g) * 0.3
batch["target_top"] = (batch["last_hidden"] @ lm_head.T).argmax(-1)
out = {}
for name, root in (("old", "/tmp/oldsrc/src"), ("new", "/work/main/src")):
    pk, dr = load(root)
    torch.manual_seed(0)
    cfg = dr.DraftModelConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                              head_dim=16, target_hidden_size=64, aux_layer_ids=[0, 1, 2], vocab_size=V,
                              draft_vocab_size=VD, num_hidden_layers=1)
    model = dr.Eagle3Draft(cfg)
    used = torch.randperm(V, generator=torch.Generator().manual_seed(5))[:VD].sort().values
    t2d = torch.zeros(V, dtype=torch.bool); t2d[used] = True
    model.init_from_target(torch.randn(V, 64, generator=torch.Generator().manual_seed(6)), None,
                           used - torch.arange(VD), t2d)
    for amp in (False, True):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            loss, stats = pk.packed_unroll(model, batch, lm_head, steps, 0.8)
        loss.backward()
        out[name, amp] = (loss.detach(), stats,
                          {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
for amp in (False, True):
    (la, sa, ga), (lb, sb, gb) = out["old", amp], out["new", amp]
    diff = max(float((ga[k] - gb[k]).abs().max()) for k in ga)
    print("bf16" if amp else "fp32", "loss", float(la), float(lb), "equal", torch.equal(la, lb),
          "stats equal", torch.equal(sa, sb), "grads equal", all(torch.equal(ga[k], gb[k]) for k in ga),
          "max grad diff", diff)
