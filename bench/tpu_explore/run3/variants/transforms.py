import sys
def combine_mulsum(s, tokens="LOCAL_TOKENS"):
    old = f'''    out = out[jnp.argsort(order)].reshape({tokens}, TOP_K, EMBED_DIM)
    y = jnp.einsum("tkd,tk->td", out, combine_weights, preferred_element_type=jnp.float32)'''
    assert old in s, tokens
    return s.replace(old, f'''    out = out[jnp.argsort(order)].reshape({tokens}, TOP_K, EMBED_DIM)
    y = jnp.sum(out.astype(jnp.float32) * combine_weights[:, :, None], axis=1)''')
def combine_loop(s, tokens="LOCAL_TOKENS"):
    old = f'''    out = out[jnp.argsort(order)].reshape({tokens}, TOP_K, EMBED_DIM)
    y = jnp.einsum("tkd,tk->td", out, combine_weights, preferred_element_type=jnp.float32)'''
    assert old in s
    return s.replace(old, f'''    copy_rows = jnp.argsort(order).reshape({tokens}, TOP_K)
    y = out[copy_rows[:, 0]].astype(jnp.float32) * combine_weights[:, 0:1]
    for k in range(1, TOP_K):
        y = y + out[copy_rows[:, k]].astype(jnp.float32) * combine_weights[:, k : k + 1]''')
def onehot(s):
    a = 'local_counts = jnp.bincount(expert_ids.reshape(ROUTED_ROWS), length=NUM_EXPERTS)'
    b = 'group_sizes = jnp.bincount(flat_ids, length=NUM_EXPERTS).astype(jnp.int32)'
    assert a in s and b in s
    s = s.replace(a, 'local_counts = jnp.sum(expert_ids.reshape(ROUTED_ROWS)[:, None] == jnp.arange(NUM_EXPERTS), axis=0, dtype=jnp.int32)')
    return s.replace(b, 'group_sizes = jnp.sum(flat_ids[:, None] == jnp.arange(NUM_EXPERTS), axis=0, dtype=jnp.int32)')
VJP = open('/tmp/hlo/vjp.txt').read()
def vjp(s, tokens="LOCAL_TOKENS"):
    old = '''    out = _expert_ffn(tokens[order // TOP_K], weights, group_sizes)'''
    assert old in s
    s = s.replace(old, f'''    copy_rows = jnp.argsort(order).reshape({tokens}, TOP_K)
    out = _expert_ffn(_sorted_copies(tokens, order, copy_rows), weights, group_sizes)''')
    old = f'''    out = out[jnp.argsort(order)].reshape({tokens}, TOP_K, EMBED_DIM)
    y = jnp.sum(out.astype(jnp.float32) * combine_weights[:, :, None], axis=1)'''
    assert old in s
    s = s.replace(old, '''    y = _combined(out, combine_weights, order, copy_rows)''')
    return s + VJP
src_whole, src_tc4, out = sys.argv[1], sys.argv[2], sys.argv[3]
src = open(src_whole).read()
open(f'{out}/h.py','w').write(src)
open(f'{out}/c1.py','w').write(combine_mulsum(src))
open(f'{out}/c2.py','w').write(onehot(combine_mulsum(src)))
open(f'{out}/c3.py','w').write(vjp(onehot(combine_mulsum(src))))
open(f'{out}/c4.py','w').write(onehot(combine_loop(src)))
if src_tc4 != "-":
    tc4 = open(src_tc4).read()
    open(f'{out}/t_h.py','w').write(tc4)
    open(f'{out}/t_c2.py','w').write(onehot(combine_mulsum(tc4, "CHUNK_TOKENS")))
