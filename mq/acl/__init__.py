"""Access control as RocketMQ 4.x does it (its "plain" ACL, `PlainAccessValidator`).

  * sign.py   - what a request's signature covers and how it is computed (HMAC-SHA1 of the
                extFields values sorted by key, then the body; Base64), for the broker that
                checks it and for our clients that send it;
  * plain.py  - the accounts file (`plain_acl.yml`): its layout, the remote-address patterns,
                the resources each request code needs, and the verdict on one request.

Imports point one way: mq.broker uses plain, mq.remoting's client uses sign (which imports
nothing of ours), plain uses mq.remoting's code table.  So this file imports nothing: the client
reaching for sign must not pull plain, and with it mq.remoting, in mid-import."""
