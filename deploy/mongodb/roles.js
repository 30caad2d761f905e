// The MongoDB roles of the relay, each with the least it needs
// (docs/upgrading.md, "Least-privilege MongoDB roles"). Create or update
// them as a user that may manage roles (userAdmin on admin):
//
//   mongosh "mongodb://<admin>@<host>/admin" --file deploy/mongodb/roles.js
//
// They are written for the database "outbox" and the outbox collection
// "events", the values of deploy/kubernetes/worker.env
// (OUTBOX_MONGO_DATABASE, OUTBOX_MONGO_COLLECTION); with other names,
// change them in the list below (deploy/'s tests hold the two together).
// Then give each user one role, e.g.
//
//   db.getSiblingDB("admin").createUser({user: "outbox-relay", pwd: passwordPrompt(),
//     roles: [{role: "outboxRelay", db: "admin"}]})
//
// outboxSetup is the user of deploy/kubernetes's setup Job (Secret
// outbox-setup), outboxRelay the relay's (Secret outbox-worker),
// outboxConsole a read-only `worker console`'s, outboxOperator the
// operator commands' and a console with OUTBOX_CONSOLE_WRITES=true.
// Producers need only insert on the outbox collection.
//
// Between "roles: begin" and "roles: end" is plain JSON: deploy/'s tests
// read it.

// roles: begin
const roles = [
  {
    "role": "outboxSetup",
    "privileges": [
      { "resource": { "db": "outbox", "collection": "events" },
        "actions": ["createCollection", "createIndex", "listIndexes"] },
      { "resource": { "db": "outbox", "collection": "events_owners" },
        "actions": ["createCollection", "createIndex", "listIndexes"] },
      { "resource": { "db": "outbox", "collection": "events_fences" },
        "actions": ["createCollection", "createIndex", "listIndexes", "find", "insert"] },
      { "resource": { "db": "outbox", "collection": "events_paused" },
        "actions": ["createCollection", "createIndex", "listIndexes"] },
      { "resource": { "db": "outbox", "collection": "events_audit" },
        "actions": ["createCollection", "createIndex", "listIndexes"] }
    ],
    "roles": []
  },
  {
    "role": "outboxRelay",
    "privileges": [
      { "resource": { "db": "outbox", "collection": "events" },
        "actions": ["find", "update", "remove", "listIndexes", "changeStream"] },
      { "resource": { "db": "outbox", "collection": "events_owners" },
        "actions": ["find", "insert", "update", "remove", "listIndexes"] },
      { "resource": { "db": "outbox", "collection": "events_fences" },
        "actions": ["find", "insert", "update", "listIndexes"] },
      { "resource": { "db": "outbox", "collection": "events_paused" },
        "actions": ["find"] }
    ],
    "roles": []
  },
  {
    "role": "outboxConsole",
    "privileges": [
      { "resource": { "db": "outbox", "collection": "events" },
        "actions": ["find", "listIndexes"] },
      { "resource": { "db": "outbox", "collection": "events_paused" },
        "actions": ["find"] },
      { "resource": { "db": "outbox", "collection": "events_audit" },
        "actions": ["find"] }
    ],
    "roles": []
  },
  {
    "role": "outboxOperator",
    "privileges": [
      { "resource": { "db": "outbox", "collection": "events" },
        "actions": ["find", "update", "listIndexes"] },
      { "resource": { "db": "outbox", "collection": "events_paused" },
        "actions": ["find", "insert", "remove"] },
      { "resource": { "db": "outbox", "collection": "events_audit" },
        "actions": ["find", "insert"] }
    ],
    "roles": []
  }
];
// roles: end

const admin = db.getSiblingDB("admin");
for (const r of roles) {
  if (admin.getRole(r.role)) {
    admin.updateRole(r.role, { privileges: r.privileges, roles: r.roles });
    print("updated role " + r.role);
  } else {
    admin.createRole(r);
    print("created role " + r.role);
  }
}
