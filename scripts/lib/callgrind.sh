# Helpers shared by the callgrind scripts (sourced).

# Program total of a callgrind profile.
cg_summary() { awk '/^(summary|totals):/ {print $2; exit}' "$1"; }

# Inclusive cost and call count per callee in one profile: the sums over the call arcs into it
# ("cfn=" + "calls=<count> <pos>" + "<pos> <cost>"); names are compressed as "(id) name" / "(id)".
# Output: "name<TAB>inclusive<TAB>calls" lines.
cg_arcs() {
  awk '
    function name(s,   id, p) {
      if (substr(s, 1, 1) != "(") return s
      id = substr(s, 2, index(s, ")") - 2)
      p = index(s, ") ")
      if (p > 0) names[id] = substr(s, p + 2)
      return names[id]
    }
    /^fn=/ { name(substr($0, 4)); next }
    /^cfn=/ { callee = name(substr($0, 5)); next }
    /^calls=/ { split(substr($0, 7), a, " "); c = a[1]; getline; calls[callee] += c; cost[callee] += $NF; next }
    END { for (k in cost) printf "%s\t%d\t%d\n", k, cost[k], calls[k] }
  ' "$1"
}

# cg_field <arcs> <function name> <column: 2 inclusive cost, 3 calls> -> value (0 if absent)
cg_field() {
  awk -F'\t' -v f="$2" -v k="$3" '$1 == f {c = $k} END {print c + 0}' <<<"$1"
}
