"""A WebShop site in the official app's format, for the adapter and setup-check tests: an HTTP request handler
that serves the embedded catalogue with the official app's routes and HTML structure (``/<session>``,
``/search_results/...``, ``/item_page/...``, ``/item_sub_page/...``, ``/done/...``). The real app (Flask,
1.2 GB of scraped products, Java for its Lucene index) is not installed in the tests.

Use: set ``OfficialFormatHandler.catalog = load_catalog()`` and serve it with
``ThreadingHTTPServer(("127.0.0.1", 0), OfficialFormatHandler)``. A search containing "explode" answers 500, one
containing "sleep" answers after a second."""

from __future__ import annotations

import ast
import html
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler

from taspo_trl.envs.webshop import purchase_reward


def _url(*parts):
    return "/" + "/".join(urllib.parse.quote(str(p), safe="") for p in parts)


class OfficialFormatHandler(BaseHTTPRequestHandler):
    """Serves the embedded catalogue with the official app's routes and page structure."""

    catalog = None

    def log_message(self, *args):
        pass

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        form = urllib.parse.parse_qs(self.rfile.read(length).decode())
        if "search_query" in form:
            keywords = form["search_query"][0].lower().split(" ")
            if "explode" in keywords:
                return self.send_error(500)
            if "sleep" in keywords:
                time.sleep(1.0)
            session = urllib.parse.unquote(self.path.strip("/"))
            self.send_response(302)
            self.send_header("Location", _url("search_results", session, str(keywords), 1))
            self.end_headers()
            return None
        return self.do_GET()

    def do_GET(self):
        parts = [urllib.parse.unquote(p) for p in self.path.strip("/").split("/")]
        session, goal = parts[1] if len(parts) > 1 else parts[0], None
        goal = self.catalog.goals["eval"][int(session.split("_")[-1])]
        head = f'<div id="instruction-text"><h4>Instruction: {html.escape(goal["instruction_text"])}</h4></div>'
        back = f'<form method="post" action="{_url(session)}"><button type="submit" class="btn btn-success">Back to Search</button></form>'
        if len(parts) == 1:
            body = (
                '<div id="logo"><h2>WebShop</h2></div><div id="instruction-text" class="text-center"><h4>Instruction: <br>'
                f'{html.escape(goal["instruction_text"])}</h4></div><form role="form" method="post" action="{_url(session)}">'
                '<input id="search_input" type="text" name="search_query" required/>'
                '<button class="btn btn-success" type="submit">Search</button></form><iframe src="x">slides</iframe>'
            )
        elif parts[0] == "search_results":
            keywords, page = ast.literal_eval(parts[2]), int(parts[3])
            results = self.catalog.search(" ".join(keywords))
            body = head + back + f"<p>Page {page} (Total results: {len(results)})</p>"
            if page > 1:
                body += f'<form method="post" action="{_url("search_results", session, parts[2], page - 1)}"><button class="btn btn-primary">&lt; Prev</button></form>'
            if page * 10 < len(results):
                body += f'<form method="post" action="{_url("search_results", session, parts[2], page + 1)}"><button class="btn btn-primary">Next &gt;</button></form>'
            for product in results[(page - 1) * 10 : page * 10]:
                link = _url("item_page", session, product["asin"], parts[2], page, {})
                body += (f'<h4 class="product-asin"><a class="product-link" href="{link}">{product["asin"]}</a></h4>'
                         f'<h4 class="product-title">{html.escape(product["Title"])}</h5><h5>{product["Price"]}</h6>')
        elif parts[0] == "item_page":
            asin, keywords, page, options = parts[2], parts[3], parts[4], ast.literal_eval(parts[5])
            product = self.catalog.by_asin[asin]
            body = head + back + f'<form method="post" action="{_url("search_results", session, keywords, page)}"><button class="btn btn-primary">&lt; Prev</button></form>'
            for name, values in product["options"].items():
                body += f"<h4>{name}</h4>"
                for value in values:
                    url = _url("item_page", session, asin, keywords, page, {**options, name: value})
                    body += f'<input type="radio" name="{name}" value="{value}" data-url="{url}"><label>{value}</label>'
            body += f"<h2>{html.escape(product['Title'])}</h2><h4>Price: {product['Price']}</h4><h4>Rating: {product['Rating']}</h4>"
            for sub in ("Description", "Features", "Reviews"):
                body += f'<form method="post" action="{_url("item_sub_page", session, asin, keywords, page, sub, options)}"><button class="btn btn-primary" type="submit">{sub}</button></form>'
            body += f'<form method="post" action="{_url("done", session, asin, options)}"><button type="submit" class="btn btn-lg purchase">Buy Now</button></form>'
        elif parts[0] == "item_sub_page":
            asin, keywords, page, sub, options = parts[2], parts[3], parts[4], parts[5], parts[6]
            product = self.catalog.by_asin[asin]
            body = head + back + f'<form method="post" action="{_url("item_page", session, asin, keywords, page, options)}"><button class="btn btn-primary">&lt; Prev</button></form>'
            body += "".join(f"<p>{html.escape(t)}</p>" for t in {"Description": [product["Description"]], "Features": product["BulletPoints"]}.get(sub, ["-"]))
        else:  # done
            asin, options = parts[2], ast.literal_eval(parts[3])
            product = self.catalog.by_asin[asin]
            score = purchase_reward(product, goal, product["price"], options)
            body = ('<h1>Thank you for shopping with us!</h1><div style="display:none"><h4>asin<pre>'
                    f'{asin}</pre></h4></div><h3 id="reward">Your score (min 0.0, max 1.0)<pre>{score}</pre></h3>'
                    "<h4 hidden>Reward Details <div><pre>{}</pre></div></h4>")
        data = f"<!DOCTYPE html><html><head><title>WebShop</title><script>var x = 1;</script></head><body>{body}</body></html>".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
