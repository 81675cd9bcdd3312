"""Model building blocks: tensor-parallel linears, embeddings, norms, rotary embedding."""
