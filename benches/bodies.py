"""Request bodies of the shell load benches (velocity_engine.sh, cluster_reads.sh): one
random generator `rnd` drives each, so a bench's files are the same from run to run."""


def transaction(rnd, i, entities, prefix="ev"):
    """Event `i` of type `transaction` (id `<prefix>-<8 digits>`) over `entities` devices,
    users and IPs, with an amount."""
    ip = rnd.randrange(entities)
    return {"id": "%s-%08d" % (prefix, i), "type": "transaction", "fields": {
        "device_id": "d%06d" % rnd.randrange(entities), "userid": "u%06d" % rnd.randrange(entities),
        "ip": "10.%d.%d.%d" % (ip >> 16 & 255, ip >> 8 & 255, ip & 255),
        "amount": rnd.randrange(100000) / 100}}


def subjects(rnd):
    """Seven never-seen subjects of a check, one of each dimension the lists hold."""
    return {"uid": "nu%09d" % rnd.randrange(10**9), "phone": "+86139%08d" % rnd.randrange(10**8),
            "device": "nd%09d" % rnd.randrange(10**9), "imei": "35%013d" % rnd.randrange(10**13),
            "ip": "172.%d.%d.%d" % (rnd.randrange(256), rnd.randrange(256), rnd.randrange(256)),
            "wifi_mac": "02-00-%02X-%02X-%02X-%02X" % tuple(rnd.randrange(256) for _ in range(4)),
            "id_card": "nid%012d" % rnd.randrange(10**12)}
